"""The engine's stop bookkeeping (no vLLM needed): a stop that names no live request is kept
for a bounded time, so a request that arrives after its own stop (both race through the
ensemble) is cancelled on arrival; stale and surplus stops are dropped."""

from __future__ import annotations

import asyncio

import pytest
from tritonforge.triton_models.engine import runner as E
from tritonforge.triton_models.engine.vllm import VllmAdapter


def _runner() -> E.EngineRunner:
    # not started: only the bookkeeping is exercised
    return E.EngineRunner(VllmAdapter("unused", {}))


def test_stop_before_arrival_cancels_that_request_once() -> None:
    runner = _runner()
    assert asyncio.run(runner._stop("req-1")) == 0  # nothing live yet
    assert runner._stopped_before_arrival("req-2") is False
    assert runner._stopped_before_arrival("req-1") is True
    assert runner._stopped_before_arrival("req-1") is False  # consumed: a retry is served
    assert asyncio.run(runner._stop("")) == 0
    assert runner._stopped_before_arrival("") is False  # requests without an id never match


def test_early_stops_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner()
    monkeypatch.setattr(E, "EARLY_STOP_SECONDS", 0.0)
    asyncio.run(runner._stop("old"))
    assert runner._stopped_before_arrival("old") is False  # expired
    monkeypatch.setattr(E, "EARLY_STOP_SECONDS", 60.0)
    monkeypatch.setattr(E, "EARLY_STOP_MAX", 3)

    async def many() -> None:
        for i in range(5):
            await runner._stop(f"r{i}")

    asyncio.run(many())
    assert len(runner._early_stops) == 3
    assert runner._stopped_before_arrival("r0") is False  # the oldest were dropped
    assert runner._stopped_before_arrival("r4") is True
