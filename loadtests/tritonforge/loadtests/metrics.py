"""genai-perf's LLM metrics computed from :class:`Record` objects (no I/O).

Definitions (as genai-perf defines them):

* time to first token (TTFT) = first response time - request send time;
* inter-token latency (ITL) = (request latency - TTFT) / (output tokens - 1), per request;
* request latency = last response time - request send time;
* output token throughput = sum of output tokens / (last response - first request);
* request throughput = requests / (last response - first request).

Only successful requests enter the latency and throughput statistics; failures are
counted apart. Output tokens are counted by re-tokenizing the returned text. Percentiles
interpolate linearly (``numpy.percentile``), as genai-perf does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

import numpy as np
from tritonforge.loadtests.records import Record

__all__ = [
    "ENTRY_ITL",
    "ENTRY_LATENCY",
    "ENTRY_TTFT",
    "LATENCY_METRICS",
    "PERCENTILES",
    "describe",
    "summarize",
    "timeline",
    "timing_type",
]

PERCENTILES: Final = (25, 50, 75, 90, 95, 99)
#: Names of the Locust statistics entries (see ``users``): one request event per logical
#: request (``ENTRY_LATENCY``, Type = the user's label) and two token-timing entries under
#: their own Type (:func:`timing_type`), outside the aggregated request count.
ENTRY_TTFT: Final = "time_to_first_token"
ENTRY_ITL: Final = "inter_token_latency"
ENTRY_LATENCY: Final = "request_latency"


def timing_type(label: str) -> str:
    """The Locust ``Type`` of the TTFT / ITL entries of a user labelled ``label``."""
    return f"{label}/timing"

#: Summary keys of the per-request latency statistics (milliseconds).
LATENCY_METRICS: Final = ("time_to_first_token_ms", "inter_token_latency_ms", "request_latency_ms")


def describe(values: list[float]) -> dict[str, float] | None:
    """count, mean, std, min, max and the :data:`PERCENTILES` of ``values``; ``None`` if empty."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out: dict[str, float] = {
        "count": float(arr.size),
        "mean": float(arr.mean()),
        "std": float(arr.std()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True):
        out[f"p{p}"] = float(v)
    return out


def summarize(records: list[Record]) -> dict[str, Any]:
    """The run's metrics: latency statistics (ms), token counts, throughputs, failures."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    ttft = [r.ttft * 1000.0 for r in ok if r.ttft is not None]
    itl = [v * 1000.0 for r in ok if (v := r.itl) is not None]
    latency = [r.latency * 1000.0 for r in ok]
    out_tokens = [float(r.output_tokens) for r in ok]
    in_tokens = [float(r.input_tokens) for r in ok if r.input_tokens >= 0]
    if ok:
        first = min(r.start for r in ok)
        last = max(r.end for r in ok)
        duration = max(last - first, 1e-9)
    else:
        first = last = math.nan
        duration = 0.0
    total_tokens = int(sum(out_tokens))
    total = len(records)
    errors = Counter(r.error for r in failed)
    return {
        "requests": {
            "total": total,
            "succeeded": len(ok),
            "failed": len(failed),
            "fail_ratio": (len(failed) / total) if total else 0.0,
        },
        "benchmark_duration_s": duration,
        "first_request_at": None if math.isnan(first) else first,
        "last_response_at": None if math.isnan(last) else last,
        "time_to_first_token_ms": describe(ttft),
        "inter_token_latency_ms": describe(itl),
        "request_latency_ms": describe(latency),
        "output_tokens_per_request": describe(out_tokens),
        "input_tokens_per_request": describe(in_tokens),
        "output_tokens_total": total_tokens,
        "output_token_throughput_per_s": (total_tokens / duration) if ok else 0.0,
        "request_throughput_per_s": (len(ok) / duration) if ok else 0.0,
        "errors": dict(errors.most_common(20)),
    }


def timeline(records: list[Record], bins: int = 30) -> dict[str, list[float]]:
    """Per-window series for the plots, windows over the run's span.

    Latency percentiles are taken over requests *finishing* in each window; output tokens
    are spread evenly over each request's generation window (first to last response), so
    ``tokens_per_s`` follows the token rate actually received.
    """
    ok = [r for r in records if r.ok]
    if not ok:
        return {"t": []}
    t0 = min(r.start for r in ok)
    t1 = max(r.end for r in ok)
    span = max(t1 - t0, 1e-6)
    n = max(1, min(bins, math.ceil(span)))  # at least one second per window
    width = span / n
    edges = [t0 + i * width for i in range(n + 1)]
    tokens = np.zeros(n)
    requests = np.zeros(n)
    groups: list[list[Record]] = [[] for _ in range(n)]
    for r in ok:
        k = min(n - 1, int((r.end - t0) / width))
        groups[k].append(r)
        requests[k] += 1
        a = r.start + (r.ttft or 0.0)
        b = max(r.end, a + 1e-9)
        for i in range(n):  # overlap of [a, b] with window i
            lo, hi = max(a, edges[i]), min(b, edges[i + 1])
            if hi > lo:
                tokens[i] += r.output_tokens * (hi - lo) / (b - a)
    series: dict[str, list[float]] = {
        "t": [(edges[i] + width / 2) - t0 for i in range(n)],
        "tokens_per_s": list(tokens / width),
        "requests_per_s": list(requests / width),
    }
    getters: dict[str, Callable[[Record], float | None]] = {
        "ttft_ms": lambda r: None if r.ttft is None else r.ttft * 1000.0,
        "itl_ms": lambda r: None if r.itl is None else r.itl * 1000.0,
        "latency_ms": lambda r: r.latency * 1000.0,
    }
    for key, get in getters.items():
        for p in (50, 95):
            col: list[float] = []
            for g in groups:
                vals = [v for r in g if (v := get(r)) is not None]
                col.append(float(np.percentile(vals, p)) if vals else math.nan)
            series[f"{key}_p{p}"] = col
    return series
