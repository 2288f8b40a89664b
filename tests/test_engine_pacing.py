"""How often the engine runner asks tritonserver whether a request was cancelled (each ask is
an IPC round trip that wakes a stub thread and a server thread): every
``pacing.CANCEL_CHECK_SECONDS`` while few requests are live, spread out under load so the asks
per second stay near ``CANCEL_CHECKS_PER_SECOND``, but every request still at least every
``CANCEL_CHECK_MAX_SECONDS``. The runner's own watchdog loop runs here on its asyncio loop with
responders that count the asks (no vLLM needed; that a dropped client's request is noticed
and aborted on the real server is tests/test_reliability_drops.py)."""

from __future__ import annotations

import asyncio

import pytest
from tritonforge.triton_models import pacing
from tritonforge.triton_models.engine import runner as E
from tritonforge.triton_models.engine.vllm import VllmAdapter

WINDOW = 2.5  # seconds the watchdog runs


class _Counting:
    def __init__(self) -> None:
        self.asked = 0

    def is_cancelled(self) -> bool:
        self.asked += 1
        return False


def _asks(live: int) -> list[int]:
    runner = E.EngineRunner(VllmAdapter("unused", {}), cancel_poll_seconds=0.01)  # not started
    responders = [_Counting() for _ in range(live)]
    for key, r in enumerate(responders, 1):
        runner._live[key] = E._Live(key, f"e{key}", responder=r, tokens=0)  # type: ignore[arg-type]

    async def run() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(runner._watch_cancellations(), WINDOW)

    asyncio.run(run())
    return [r.asked for r in responders]


def test_few_live_requests_are_each_asked_every_quarter_second() -> None:
    asks = _asks(4)
    assert pacing.cancel_check_seconds(4) == pacing.CANCEL_CHECK_SECONDS
    # ideally WINDOW / 0.25 = 10 each; never more than that plus the first ask
    assert all(4 <= n <= WINDOW / pacing.CANCEL_CHECK_SECONDS + 1 for n in asks), asks


def test_many_live_requests_are_asked_less_often_but_each_within_the_maximum() -> None:
    live = 4 * int(pacing.CANCEL_CHECKS_PER_SECOND * pacing.CANCEL_CHECK_MAX_SECONDS)
    assert pacing.cancel_check_seconds(live) == pacing.CANCEL_CHECK_MAX_SECONDS
    asks = _asks(live)
    assert min(asks) >= 2, min(asks)  # the first ask, then one at most a second later
    assert max(asks) <= WINDOW / pacing.CANCEL_CHECK_MAX_SECONDS + 1, max(asks)
    # a quarter of what a fixed 0.25-s check would ask
    assert sum(asks) <= live * (WINDOW / pacing.CANCEL_CHECK_MAX_SECONDS + 1)


def test_the_interval_stretches_with_load_between_its_bounds() -> None:
    steps = [pacing.cancel_check_seconds(n) for n in range(0, 200)]
    assert steps == sorted(steps)
    assert steps[0] == pacing.CANCEL_CHECK_SECONDS and steps[-1] == pacing.CANCEL_CHECK_MAX_SECONDS
    mid = 20
    assert pacing.cancel_check_seconds(mid) == pytest.approx(mid / pacing.CANCEL_CHECKS_PER_SECOND)


@pytest.mark.parametrize(("live", "expected"), [
    (1, 0.0), (7, 0.0),          # below coalesce_from: every token as generated
    (8, 0.25), (16, 0.5), (32, 1.0),  # stretched with the live streams
    (64, 1.0), (10_000, 1.0),    # at most COALESCE_MAX_FACTOR times the spec's interval
])
def test_coalescing_stretches_with_live_streams_up_to_its_cap(live: int, expected: float) -> None:
    assert pacing.COALESCE_MAX_FACTOR == 4
    assert pacing.coalesce_interval(0.25, live, 8) == pytest.approx(expected)


def test_no_interval_means_no_coalescing() -> None:
    assert pacing.coalesce_interval(0.0, 1000, 8) == 0.0


def test_the_runner_holds_a_stream_back_by_the_stretched_interval() -> None:
    runner = E.EngineRunner(VllmAdapter("unused", {}), stream_interval_s=0.25, coalesce_from=8)  # not started
    for key in range(1, 33):
        runner._live[key] = E._Live(key, f"e{key}", responder=_Counting(), tokens=0)  # type: ignore[arg-type]
    seq = E._Sequence(0, [], [])
    seq.last_sent = 100.0
    assert runner._hold_back(seq, 100.9)  # 32 live: 1 s
    assert not runner._hold_back(seq, 101.0)
    for key in range(9, 33):
        del runner._live[key]
    assert not runner._hold_back(seq, 100.3)  # 8 live: 0.25 s
    seq.last_sent = None
    assert not runner._hold_back(seq, 100.0)  # a first response never waits
