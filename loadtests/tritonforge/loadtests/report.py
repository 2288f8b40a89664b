"""The results folder: summary JSON and PNG plots (matplotlib, Agg backend).

Locust itself writes the CSV (``--csv``) and HTML (``--html``) files; this module adds
``summary.json`` (genai-perf's metrics, the gates, the run's settings) and two plots:
``latency_percentiles.png`` (TTFT, ITL and request latency p50/p95 over time) and
``throughput.png`` (output tokens/s and requests/s over time).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Final

__all__ = ["LATENCY_PLOT", "SUMMARY_FILE", "THROUGHPUT_PLOT", "plot", "write_summary"]

SUMMARY_FILE: Final = "summary.json"
LATENCY_PLOT: Final = "latency_percentiles.png"
THROUGHPUT_PLOT: Final = "throughput.png"


def write_summary(folder: Path, summary: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def _clean(values: list[float]) -> list[float]:
    return [v if math.isfinite(v) else float("nan") for v in values]


def plot(folder: Path, series: dict[str, list[float]], title: str) -> list[Path]:
    """Write the two PNG plots; returns their paths (none when there is no data)."""
    if not series.get("t"):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = series["t"]
    out: list[Path] = []

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for ax, key, name in zip(axes, ("ttft_ms", "itl_ms", "latency_ms"),
                             ("time to first token", "inter-token latency", "request latency"),
                             strict=True):
        for p, style in ((50, "-"), (95, "--")):
            ax.plot(t, _clean(series[f"{key}_p{p}"]), style, marker=".", label=f"p{p}")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
    axes[-1].set_xlabel("seconds since the first request")
    fig.suptitle(f"{title}: latency percentiles over time")
    fig.tight_layout()
    path = folder / LATENCY_PLOT
    fig.savefig(path, dpi=90)
    plt.close(fig)
    out.append(path)

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(t, series["tokens_per_s"], "-", marker=".", color="tab:blue", label="output tokens/s")
    ax.set_ylabel("output tokens/s")
    ax.set_xlabel("seconds since the first request")
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(t, series["requests_per_s"], "--", color="tab:orange", label="requests/s")
    ax2.set_ylabel("requests/s")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper left")
    ax.set_title(f"{title}: throughput over time")
    fig.tight_layout()
    path = folder / THROUGHPUT_PLOT
    fig.savefig(path, dpi=90)
    plt.close(fig)
    out.append(path)
    return out
