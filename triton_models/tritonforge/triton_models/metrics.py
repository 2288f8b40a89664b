"""Engine metrics of tritonforge's Python engine model, on Triton's own ``/metrics`` endpoint.

The engine model creates one :class:`EngineMetrics` in ``initialize()`` and calls its
``observe_*`` / ``add_*`` / ``set_*`` methods while it generates; ``close()`` in
``finalize()``.  Inside Triton the values go through the Python backend's custom-metrics
API (``triton_python_backend_utils.MetricFamily``), so they appear next to Triton's
``nv_inference_*`` metrics on the metrics port (8002) and one Prometheus scrape gets both.

Each metric update is an IPC round trip from the stub process to the server, so inside
Triton the updates are queued and applied by a daemon thread: callers (the engine's event
loop) never block on them.  ``flush()`` waits until the queue is applied.

Outside Triton (unit tests, plain Python) ``triton_python_backend_utils`` cannot be imported;
the same calls then record into an in-memory store, applied immediately, which
:meth:`EngineMetrics.samples` exposes in Prometheus' sample form (``_bucket``/``_sum``/
``_count`` for histograms), exactly the series a scrape of the server shows.

Triton 2.51 (release 24.10), the server bundled here, supports histogram families
(``MetricFamily.HISTOGRAM`` with ``Metric(labels, buckets=...)`` and ``observe``); on a
server without it, histograms are emulated with counter families named ``<name>_bucket``
(label ``le``), ``<name>_sum`` and ``<name>_count``, so ``histogram_quantile`` works the same.

Series (all labelled ``model`` and ``version``); running, waiting and KV usage are the engine
scheduler's own report (vLLM's stat loggers), not a count kept by tritonforge:

====================================================  =========  ====================
``tritonforge_engine_time_to_first_token_seconds``     histogram
``tritonforge_engine_time_per_output_token_seconds``   histogram
``tritonforge_engine_e2e_request_latency_seconds``     histogram
``tritonforge_engine_prompt_tokens_total``             counter
``tritonforge_engine_generation_tokens_total``         counter
``tritonforge_engine_requests_running``                gauge
``tritonforge_engine_requests_waiting``                gauge
``tritonforge_engine_kv_cache_usage_ratio``            gauge      0..1
``tritonforge_engine_requests_finished_total``         counter    + ``finish_reason``
``tritonforge_engine_abort_failures_total``            counter
``tritonforge_engine_up``                              gauge      1, 0 once the engine died
``tritonforge_engine_queue_full_rejections_total``     counter    refused: queue full
``tritonforge_engine_prefix_cache_queries_total``      counter    vLLM's own, tokens
``tritonforge_engine_prefix_cache_hits_total``         counter    vLLM's own, tokens
``tritonforge_engine_spec_decode_drafts_total``        counter    vLLM's own
``tritonforge_engine_spec_decode_draft_tokens_total``  counter    vLLM's own
``tritonforge_engine_spec_decode_accepted_tokens_total`` counter  vLLM's own
====================================================  =========  ====================

The prefix-cache and speculative-decoding counters are vLLM's scheduler stats (the counts
vLLM's own Prometheus logger exports as ``vllm:prefix_cache_queries``/``_hits`` and
``vllm:spec_decode_num_drafts``/``_num_draft_tokens``/``_num_accepted_tokens``), summed by
the engine model's stat logger; they stay 0 while the knob is off.
"""

from __future__ import annotations

import bisect
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

from tritonforge.contract import FinishReason

__all__ = [
    "ABORT_FAILURES",
    "E2E_BUCKETS",
    "E2E_LATENCY",
    "ENGINE_COUNTERS",
    "ENGINE_METRIC_NAMES",
    "ENGINE_UP",
    "GENERATION_TOKENS",
    "HISTOGRAMS",
    "KV_CACHE_USAGE",
    "POSTPROCESSING_METRIC_NAMES",
    "POST_FINISHED",
    "POST_OPEN_REQUESTS",
    "POST_REQUEST_FACTS",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_QUERIES",
    "PROMPT_TOKENS",
    "QUEUE_FULL_REJECTIONS",
    "REQUESTS_FINISHED",
    "REQUESTS_RUNNING",
    "REQUESTS_WAITING",
    "SPEC_ACCEPTED_TOKENS",
    "SPEC_DRAFTS",
    "SPEC_DRAFT_TOKENS",
    "TIME_PER_OUTPUT_TOKEN",
    "TPOT_BUCKETS",
    "TTFT",
    "TTFT_BUCKETS",
    "EngineMetrics",
    "PostprocessingMetrics",
]

TTFT: Final = "tritonforge_engine_time_to_first_token_seconds"
TIME_PER_OUTPUT_TOKEN: Final = "tritonforge_engine_time_per_output_token_seconds"
E2E_LATENCY: Final = "tritonforge_engine_e2e_request_latency_seconds"
PROMPT_TOKENS: Final = "tritonforge_engine_prompt_tokens_total"
GENERATION_TOKENS: Final = "tritonforge_engine_generation_tokens_total"
REQUESTS_RUNNING: Final = "tritonforge_engine_requests_running"
REQUESTS_WAITING: Final = "tritonforge_engine_requests_waiting"
KV_CACHE_USAGE: Final = "tritonforge_engine_kv_cache_usage_ratio"
REQUESTS_FINISHED: Final = "tritonforge_engine_requests_finished_total"
ABORT_FAILURES: Final = "tritonforge_engine_abort_failures_total"
ENGINE_UP: Final = "tritonforge_engine_up"
QUEUE_FULL_REJECTIONS: Final = "tritonforge_engine_queue_full_rejections_total"
PREFIX_CACHE_QUERIES: Final = "tritonforge_engine_prefix_cache_queries_total"
PREFIX_CACHE_HITS: Final = "tritonforge_engine_prefix_cache_hits_total"
SPEC_DRAFTS: Final = "tritonforge_engine_spec_decode_drafts_total"
SPEC_DRAFT_TOKENS: Final = "tritonforge_engine_spec_decode_draft_tokens_total"
SPEC_ACCEPTED_TOKENS: Final = "tritonforge_engine_spec_decode_accepted_tokens_total"
#: ``EngineCounts`` field -> the counter it feeds.
ENGINE_COUNTERS: Final[dict[str, str]] = {
    "prefix_cache_queries": PREFIX_CACHE_QUERIES,
    "prefix_cache_hits": PREFIX_CACHE_HITS,
    "spec_drafts": SPEC_DRAFTS,
    "spec_draft_tokens": SPEC_DRAFT_TOKENS,
    "spec_accepted_tokens": SPEC_ACCEPTED_TOKENS,
}

TTFT_BUCKETS: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
TPOT_BUCKETS: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1.0, 2.5, 5.0,
)
E2E_BUCKETS: Final[tuple[float, ...]] = (
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0,
    60.0, 90.0, 120.0, 300.0,
)
HISTOGRAMS: Final[dict[str, tuple[float, ...]]] = {
    TTFT: TTFT_BUCKETS,
    TIME_PER_OUTPUT_TOKEN: TPOT_BUCKETS,
    E2E_LATENCY: E2E_BUCKETS,
}
_COUNTERS: Final = (PROMPT_TOKENS, GENERATION_TOKENS, REQUESTS_FINISHED, ABORT_FAILURES,
                    QUEUE_FULL_REJECTIONS, *ENGINE_COUNTERS.values())
_GAUGES: Final = (REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE, ENGINE_UP)

#: Every series name a scrape shows for these metrics (histograms expanded).
ENGINE_METRIC_NAMES: Final[frozenset[str]] = frozenset(
    {f"{h}{s}" for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
    | set(_COUNTERS)
    | set(_GAUGES)
)

_DESCRIPTIONS: Final = {
    TTFT: "Time from request arrival at the engine to its first generated token, seconds.",
    TIME_PER_OUTPUT_TOKEN: "Time between consecutive generated tokens of a request, seconds.",
    E2E_LATENCY: "Time from request arrival at the engine to its last token, seconds.",
    PROMPT_TOKENS: "Prompt tokens processed by the engine.",
    GENERATION_TOKENS: "Tokens generated by the engine.",
    REQUESTS_RUNNING: "Requests the engine is currently generating for.",
    REQUESTS_WAITING: "Requests queued in the engine, not yet scheduled.",
    KV_CACHE_USAGE: "Fraction of the engine's KV cache in use (0..1).",
    REQUESTS_FINISHED: "Requests finished by the engine, by finish reason.",
    ABORT_FAILURES: "Aborts the engine refused (it may still be generating for the request).",
    ENGINE_UP: "1 while the inference engine can serve; 0 once it has died (restart the server).",
    QUEUE_FULL_REJECTIONS: "Requests refused with OVERLOADED because the engine held max_num_seqs "
                           "running plus batching.max_queue_size waiting requests.",
    PREFIX_CACHE_QUERIES: "Prompt tokens the engine looked up in its prefix cache (vLLM's own count).",
    PREFIX_CACHE_HITS: "Prompt tokens found in the engine's prefix cache (vLLM's own count).",
    SPEC_DRAFTS: "Speculative-decoding drafts proposed (vLLM's own count).",
    SPEC_DRAFT_TOKENS: "Tokens proposed by speculative decoding (vLLM's own count).",
    SPEC_ACCEPTED_TOKENS: "Proposed tokens the target model accepted (vLLM's own count).",
}

_Labels = dict[str, str]
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def _fmt_le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# ------------------------------------------------------------------------------------------
# In-memory store: used outside Triton; also the model of what Triton exposes.
class _MemoryMetric:
    def __init__(self, kind: str, buckets: tuple[float, ...] = ()) -> None:
        self.kind = kind
        self.value = 0.0
        self.buckets = buckets
        self.bucket_counts = [0] * (len(buckets) + 1)  # last: +Inf
        self.sum = 0.0
        self.count = 0

    def increment(self, v: float) -> None:
        self.value += v

    def set(self, v: float) -> None:
        self.value = v

    def observe(self, v: float) -> None:
        self.bucket_counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1


class _MemoryStore:
    def __init__(self) -> None:
        self.metrics: dict[tuple[str, tuple[tuple[str, str], ...]], _MemoryMetric] = {}

    def metric(
        self, name: str, kind: str, labels: _Labels, buckets: tuple[float, ...] = ()
    ) -> _MemoryMetric:
        key = (name, tuple(sorted(labels.items())))
        if key not in self.metrics:
            self.metrics[key] = _MemoryMetric(kind, buckets)
        return self.metrics[key]

    def samples(self) -> dict[SampleKey, float]:
        out: dict[SampleKey, float] = {}
        for (name, labels), m in self.metrics.items():
            if m.kind != "histogram":
                out[(name, labels)] = m.value
                continue
            cumulative = 0
            for bound, n in zip((*m.buckets, float("inf")), m.bucket_counts):
                cumulative += n
                le = tuple(sorted((*labels, ("le", _fmt_le(bound)))))
                out[(f"{name}_bucket", le)] = float(cumulative)
            out[(f"{name}_sum", labels)] = m.sum
            out[(f"{name}_count", labels)] = float(m.count)
        return out


# ------------------------------------------------------------------------------------------
# Triton's custom-metrics API.
def _load_pb_utils() -> Any | None:
    try:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
    except ImportError:
        return None
    return pb_utils if hasattr(pb_utils, "MetricFamily") else None


class _TritonHistogram:
    """A histogram on Triton: native when the server has it, else three counter families."""

    def __init__(self, families: dict[str, Any], pb: Any, name: str, labels: _Labels,
                 buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        native = getattr(pb.MetricFamily, "HISTOGRAM", None)
        self.native: Any | None = None
        self.bucket_metrics: list[Any] = []
        if native is not None:
            self.native = families[name].Metric(labels=labels, buckets=list(buckets))
            return
        self.bucket_metrics = [
            families[f"{name}_bucket"].Metric(labels={**labels, "le": _fmt_le(b)})
            for b in (*buckets, float("inf"))
        ]
        self.sum_metric = families[f"{name}_sum"].Metric(labels=labels)
        self.count_metric = families[f"{name}_count"].Metric(labels=labels)

    def observe(self, v: float) -> None:
        if self.native is not None:
            self.native.observe(v)
            return
        for metric in self.bucket_metrics[bisect.bisect_left(self.buckets, v):]:
            metric.increment(1.0)
        self.sum_metric.increment(v)
        self.count_metric.increment(1.0)


class _TritonSink:
    """Creates the families once and applies queued updates on a daemon thread."""

    def __init__(self, pb: Any, labels: _Labels) -> None:
        self.pb = pb
        self.labels = labels
        fam = pb.MetricFamily
        self.families: dict[str, Any] = {}
        self.metrics: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        native_histograms = hasattr(fam, "HISTOGRAM")
        for name in HISTOGRAMS:
            if native_histograms:
                self._family(name, fam.HISTOGRAM)
            else:
                for suffix in ("_bucket", "_sum", "_count"):
                    self._family(f"{name}{suffix}", fam.COUNTER, name)
        for name in _COUNTERS:
            self._family(name, fam.COUNTER)
        for name in _GAUGES:
            self._family(name, fam.GAUGE)
        self.histograms = {
            name: _TritonHistogram(self.families, pb, name, labels, buckets)
            for name, buckets in HISTOGRAMS.items()
        }
        self.queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.pending = 0
        self.cond = threading.Condition()
        self.failures = 0
        self.thread = threading.Thread(target=self._run, name="tritonforge-metrics", daemon=True)
        self.thread.start()

    def _family(self, name: str, kind: Any, described_as: str | None = None) -> None:
        self.families[name] = self.pb.MetricFamily(
            name=name, description=_DESCRIPTIONS[described_as or name], kind=kind
        )

    def metric(self, name: str, extra: _Labels | None = None) -> Any:
        labels = {**self.labels, **(extra or {})}
        key = (name, tuple(sorted(labels.items())))
        if key not in self.metrics:
            self.metrics[key] = self.families[name].Metric(labels=labels)
        return self.metrics[key]

    def submit(self, op: Callable[[], None]) -> None:
        with self.cond:
            self.pending += 1
        self.queue.put(op)

    def _run(self) -> None:
        while True:
            op = self.queue.get()
            if op is None:
                return
            try:
                op()
            except Exception as exc:  # noqa: BLE001 - metrics must never take inference down
                self.failures += 1
                if self.failures == 1:
                    self._warn(f"tritonforge engine metrics: update failed: {exc!r}")
            finally:
                with self.cond:
                    self.pending -= 1
                    self.cond.notify_all()

    def _warn(self, message: str) -> None:
        logger = getattr(self.pb, "Logger", None)
        if logger is not None:
            logger.log_warn(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def flush(self, timeout: float | None = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.pending == 0, timeout=timeout)

    def close(self) -> None:
        self.flush()
        self.queue.put(None)
        self.thread.join(timeout=10)
        # Metric objects must be released before their families (the API requires it).
        self.histograms.clear()
        self.metrics.clear()
        self.families.clear()


# ------------------------------------------------------------------------------------------
class EngineMetrics:
    """The engine model's metrics; see the module docstring for names and semantics.

    Every method is safe to call from any thread, never raises for a metrics failure, and
    inside Triton returns without waiting for the server.
    """

    def __init__(self, model_name: str, model_version: str = "1") -> None:
        self.labels: _Labels = {"model": model_name, "version": str(model_version)}
        pb = _load_pb_utils()
        self._memory: _MemoryStore | None = None
        self._triton: _TritonSink | None = None
        self._lock = threading.Lock()
        if pb is None:
            self._memory = _MemoryStore()
        else:
            self._triton = _TritonSink(pb, self.labels)
        # Create every series up front (at zero), so the endpoint lists them before the first
        # request and rate()/increase() see the first increment.
        if self._memory is not None:
            for name, buckets in HISTOGRAMS.items():
                self._memory.metric(name, "histogram", self.labels, buckets)
        for name in (PROMPT_TOKENS, GENERATION_TOKENS, ABORT_FAILURES, QUEUE_FULL_REJECTIONS,
                     *ENGINE_COUNTERS.values()):
            self._increment(name, 0, allow_zero=True)
        for name in _GAUGES:
            self._set(name, 1.0 if name == ENGINE_UP else 0.0)
        for reason in FinishReason:
            if reason.value:
                self.add_request_finished(reason.value, _count=0)

    @property
    def in_triton(self) -> bool:
        """True when the values go to Triton's metrics endpoint."""
        return self._triton is not None

    # -- recording -------------------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        self._observe(TTFT, seconds)

    def observe_time_per_output_token(self, seconds: float) -> None:
        self._observe(TIME_PER_OUTPUT_TOKEN, seconds)

    def observe_e2e(self, seconds: float) -> None:
        self._observe(E2E_LATENCY, seconds)

    def add_prompt_tokens(self, n: int) -> None:
        self._increment(PROMPT_TOKENS, n)

    def add_generation_tokens(self, n: int) -> None:
        self._increment(GENERATION_TOKENS, n)

    def set_running(self, n: int) -> None:
        self._set(REQUESTS_RUNNING, max(0, n))

    def set_waiting(self, n: int) -> None:
        self._set(REQUESTS_WAITING, max(0, n))

    def set_kv_cache_usage(self, fraction: float) -> None:
        self._set(KV_CACHE_USAGE, min(1.0, max(0.0, float(fraction))))

    def add_request_finished(self, finish_reason: str, _count: int = 1) -> None:
        reason = str(finish_reason) or "unknown"
        self._increment(REQUESTS_FINISHED, _count, {"finish_reason": reason}, allow_zero=True)

    def set_engine_up(self, up: bool) -> None:
        self._set(ENGINE_UP, 1.0 if up else 0.0)

    def add_abort_failure(self) -> None:
        self._increment(ABORT_FAILURES, 1)

    def add_queue_full_rejection(self) -> None:
        self._increment(QUEUE_FULL_REJECTIONS, 1)

    def add_engine_counts(self, delta: Any) -> None:
        """Add an ``EngineCounts`` delta (the engine's own totals) to their counters."""
        for field, name in ENGINE_COUNTERS.items():
            self._increment(name, int(getattr(delta, field, 0) or 0))

    # -- lifecycle / inspection --------------------------------------------------------------
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until queued updates reach the server; True when the queue is empty."""
        return True if self._triton is None else self._triton.flush(timeout)

    def close(self) -> None:
        """Apply pending updates and release the metric objects (call in ``finalize``)."""
        if self._triton is not None:
            self._triton.close()
            self._triton = None

    def samples(self) -> dict[SampleKey, float]:
        """In-memory values as ``{(series name, sorted label pairs): value}``.

        Only outside Triton (inside, scrape the metrics endpoint); raises ``RuntimeError``.
        """
        if self._memory is None:
            raise RuntimeError("inside Triton the values live on the metrics endpoint")
        with self._lock:
            return self._memory.samples()

    def value(self, name: str, **labels: str) -> float:
        """One in-memory sample by series name and extra labels (0.0 when absent)."""
        key = tuple(sorted({**self.labels, **labels}.items()))
        return self.samples().get((name, key), 0.0)

    # -- internals -------------------------------------------------------------------------
    def _observe(self, name: str, seconds: float) -> None:
        v = float(seconds)
        if not v >= 0.0 or v == float("inf"):  # NaN, negative or infinite: a caller bug
            return
        if self._memory is not None:
            with self._lock:
                self._memory.metric(name, "histogram", self.labels, HISTOGRAMS[name]).observe(v)
        elif self._triton is not None:
            hist = self._triton.histograms[name]
            self._triton.submit(lambda: hist.observe(v))

    def _increment(self, name: str, n: float, extra: _Labels | None = None,
                   allow_zero: bool = False) -> None:
        if n < 0 or (n == 0 and not allow_zero):
            return
        labels = {**self.labels, **(extra or {})}
        if self._memory is not None:
            with self._lock:
                metric = self._memory.metric(name, "counter", labels)
                if n:
                    metric.increment(float(n))
        elif self._triton is not None:
            sink = self._triton

            def op() -> None:
                metric = sink.metric(name, extra)
                if n:
                    metric.increment(float(n))

            sink.submit(op)

    def _set(self, name: str, v: float) -> None:
        if self._memory is not None:
            with self._lock:
                self._memory.metric(name, "gauge", self.labels).set(float(v))
        elif self._triton is not None:
            sink = self._triton
            sink.submit(lambda: sink.metric(name).set(float(v)))


# ------------------------------------------------------------------------------------------
POST_OPEN_REQUESTS: Final = "tritonforge_postprocessing_open_requests"
POST_REQUEST_FACTS: Final = "tritonforge_postprocessing_request_facts"
POST_FINISHED: Final = "tritonforge_postprocessing_requests_finished_total"
POSTPROCESSING_METRIC_NAMES: Final = frozenset({POST_OPEN_REQUESTS, POST_REQUEST_FACTS, POST_FINISHED})
_POST_DESCRIPTIONS: Final = {
    POST_OPEN_REQUESTS: "Requests postprocessing holds detokenizer state for (freed on each "
                        "request's last response or cancellation).",
    POST_REQUEST_FACTS: "Request facts preprocessing left for postprocessing (TensorRT-LLM C++ "
                        "path only; deleted on each request's last response).",
    POST_FINISHED: "Streams postprocessing ended, by the finish reason it answered.",
}


class PostprocessingMetrics:
    """Postprocessing's own series (labelled ``model``, ``version``): how much per-request
    state it holds, and the finish reasons it answered. Gauges are set only when they
    change; outside Triton the values are kept in memory (``value``)."""

    def __init__(self, model_name: str, model_version: str = "1") -> None:
        self.labels: _Labels = {"model": model_name, "version": str(model_version)}
        self._values: dict[SampleKey, float] = {}
        self._metrics: dict[SampleKey, Any] = {}
        self._families: dict[str, Any] = {}
        pb = _load_pb_utils()
        if pb is not None:
            fam = pb.MetricFamily
            for name, kind in ((POST_OPEN_REQUESTS, fam.GAUGE), (POST_REQUEST_FACTS, fam.GAUGE),
                               (POST_FINISHED, fam.COUNTER)):
                self._families[name] = fam(name=name, description=_POST_DESCRIPTIONS[name], kind=kind)

    def _metric(self, name: str, extra: _Labels | None = None) -> tuple[SampleKey, Any]:
        labels = {**self.labels, **(extra or {})}
        key = (name, tuple(sorted(labels.items())))
        if key not in self._metrics and self._families:
            self._metrics[key] = self._families[name].Metric(labels=labels)
        return key, self._metrics.get(key)

    def _set(self, name: str, v: float) -> None:
        key, m = self._metric(name)
        if self._values.get(key) == v:
            return
        self._values[key] = v
        if m is not None:
            m.set(v)

    def set_open_requests(self, n: int) -> None:
        self._set(POST_OPEN_REQUESTS, float(n))

    def set_request_facts(self, n: int) -> None:
        self._set(POST_REQUEST_FACTS, float(n))

    def add_finished(self, finish_reason: str) -> None:
        key, m = self._metric(POST_FINISHED, {"finish_reason": finish_reason or "none"})
        self._values[key] = self._values.get(key, 0.0) + 1
        if m is not None:
            m.increment(1)

    def value(self, name: str, **labels: str) -> float:
        return self._values.get((name, tuple(sorted({**self.labels, **labels}.items()))), 0.0)

    def close(self) -> None:
        self._metrics.clear()  # metrics before their families (the API requires it)
        self._families.clear()
