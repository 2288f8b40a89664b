"""How often the Python models ask tritonserver things that cost an IPC round trip.

Every ``request.is_cancelled()`` and every custom-metric update is a message from the stub
process to tritonserver and back: a wake-up of a stub thread and of a server thread. On a
small CPU machine those wake-ups preempt vLLM's OpenMP threads, so their number per second,
not per request, is what costs throughput. The engine model and postprocessing pace their
cancellation checks, the engine model its scheduler gauges and its streamed responses, by
what is defined here.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CANCEL_CHECKS_PER_SECOND",
    "CANCEL_CHECK_MAX_SECONDS",
    "CANCEL_CHECK_SECONDS",
    "COALESCE_MAX_FACTOR",
    "GAUGE_MIN_SECONDS",
    "cancel_check_seconds",
    "coalesce_interval",
]

CANCEL_CHECK_SECONDS: Final = 0.25
"""Each live request's cancellation is asked at least this often while few are live."""

CANCEL_CHECKS_PER_SECOND: Final = 40
"""Above ``CANCEL_CHECKS_PER_SECOND * CANCEL_CHECK_SECONDS`` live requests the checks are
spread out so that a model asks at most about this many per second ..."""

CANCEL_CHECK_MAX_SECONDS: Final = 1.0
"""... but never less often than this per request: a client that left is noticed within it."""

GAUGE_MIN_SECONDS: Final = 0.25
"""The engine gauges, whose KV-cache usage moves every engine step, are sent at most this
often; they go out at once when running or waiting change, or when all turn 0 (idle)."""

COALESCE_MAX_FACTOR: Final = 4
"""Coalescing stretches the spec's ``stream_interval_ms`` at most this many times."""


def cancel_check_seconds(live: int) -> float:
    """Seconds between two ``is_cancelled()`` checks of one request while ``live`` requests
    are open: ``CANCEL_CHECK_SECONDS``, stretched with load up to ``CANCEL_CHECK_MAX_SECONDS``."""
    return min(CANCEL_CHECK_MAX_SECONDS, max(CANCEL_CHECK_SECONDS, live / CANCEL_CHECKS_PER_SECOND))


def coalesce_interval(interval_s: float, live: int, coalesce_from: int) -> float:
    """How long a stream's new tokens may wait for company with ``live`` requests in flight:
    0 below ``coalesce_from`` live requests (every token goes out as generated), else
    ``interval_s`` stretched in proportion to ``live / coalesce_from``, at most
    :data:`COALESCE_MAX_FACTOR` times. So from ``coalesce_from`` streams up to that factor the
    engine sends about ``coalesce_from / interval_s`` responses a second in all, however many
    streams share it: each response costs the host the same (engine stub, tritonserver,
    postprocessing, the HTTP front), and on a CPU that host work is taken from the engine
    (``benchmarks/bench_peer.py`` prints it per output token)."""
    if interval_s <= 0 or live < coalesce_from:
        return 0.0
    return interval_s * min(float(COALESCE_MAX_FACTOR), live / max(1, coalesce_from))
