"""SLO gates: limits on the run's summary that decide the process exit code (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["GATE_EXIT_CODE", "GateResult", "Gates", "evaluate"]

GATE_EXIT_CODE: Final = 3
"""Exit code of a run that violated at least one gate (Locust uses 1 for failures)."""


@dataclass(frozen=True)
class Gates:
    """Limits (``None``: not gated)."""

    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    max_fail_ratio: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_p95_ms, self.itl_p95_ms, self.max_fail_ratio))


@dataclass(frozen=True)
class GateResult:
    name: str  # the command-line flag
    limit: float
    value: float | None  # None: nothing measured
    passed: bool

    def message(self) -> str:
        got = "nothing measured" if self.value is None else f"{self.value:.4g}"
        verdict = "passed" if self.passed else "FAILED"
        return f"SLO gate {self.name} {verdict}: limit {self.limit:g}, measured {got}"

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.name, "limit": self.limit, "value": self.value, "passed": self.passed}


def _p95(summary: dict[str, Any], key: str) -> float | None:
    stats = summary.get(key)
    return None if not stats else float(stats["p95"])


def evaluate(gates: Gates, summary: dict[str, Any]) -> list[GateResult]:
    """One result per configured gate. A latency gate with nothing measured fails."""
    out: list[GateResult] = []
    for flag, limit, value in (
        ("--slo-ttft-p95-ms", gates.ttft_p95_ms, _p95(summary, "time_to_first_token_ms")),
        ("--slo-itl-p95-ms", gates.itl_p95_ms, _p95(summary, "inter_token_latency_ms")),
    ):
        if limit is not None:
            out.append(GateResult(flag, limit, value, value is not None and value <= limit))
    if gates.max_fail_ratio is not None:
        req = summary["requests"]
        ratio = float(req["fail_ratio"]) if req["total"] else None
        out.append(GateResult("--max-fail-ratio", gates.max_fail_ratio, ratio,
                              ratio is not None and ratio <= gates.max_fail_ratio))
    return out
