"""How often the Python models ask tritonserver things that cost an IPC round trip.

Every ``request.is_cancelled()`` and every custom-metric update is a message from the stub
process to tritonserver and back: a wake-up of a stub thread and of a server thread. On a
small CPU machine those wake-ups preempt vLLM's OpenMP threads, so their number per second,
not per request, is what costs throughput. The engine model and postprocessing pace their
cancellation checks, and the engine model its scheduler gauges, by what is defined here.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CANCEL_CHECK_MAX_SECONDS", "CANCEL_CHECK_SECONDS", "CANCEL_CHECKS_PER_SECOND",
           "GAUGE_MIN_SECONDS", "cancel_check_seconds"]

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


def cancel_check_seconds(live: int) -> float:
    """Seconds between two ``is_cancelled()`` checks of one request while ``live`` requests
    are open: ``CANCEL_CHECK_SECONDS``, stretched with load up to ``CANCEL_CHECK_MAX_SECONDS``."""
    return min(CANCEL_CHECK_MAX_SECONDS, max(CANCEL_CHECK_SECONDS, live / CANCEL_CHECKS_PER_SECOND))
