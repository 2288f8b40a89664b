"""``batching.max_queue_size`` bookkeeping of the engine runner (no vLLM needed; the real
server proof is ``test_knobs_vllm.py::test_queue_full_is_refused_at_once_and_counted``): the
engine may hold ``max_num_seqs`` running plus ``max_queue_size`` waiting requests, counted on
arrival, so a burst into an idle engine is not refused while it has free sequences."""

from __future__ import annotations

from tritonforge.triton_models.engine import runner as E
from tritonforge.triton_models.engine.vllm import VllmAdapter


class _Sized(VllmAdapter):
    """vLLM's adapter with the scheduler's max_num_seqs answered without an engine."""

    def __init__(self, max_num_seqs: int | None) -> None:
        super().__init__("unused", {})
        self._slots = max_num_seqs

    @property
    def max_num_seqs(self) -> int | None:
        return self._slots


def _runner(slots: int | None, queue: int = 2) -> E.EngineRunner:
    return E.EngineRunner(_Sized(slots), max_queue_size=queue)  # not started


def _hold(runner: E.EngineRunner, n: int, *, started: bool = False) -> None:
    for _ in range(n):
        key = len(runner._live) + 1
        runner._live[key] = E._Live(key, f"e{key}", responder=None, tokens=0, started=started)  # type: ignore[arg-type]


def _arrive(runner: E.EngineRunner) -> str | None:
    live = E._Live(0, "new", responder=None, tokens=0)  # type: ignore[arg-type]
    return runner._queue_full(live)


def test_a_burst_into_an_idle_engine_fills_its_sequences_then_the_queue() -> None:
    runner = _runner(slots=4, queue=2)
    _hold(runner, 5)  # five arrived together, none has a token yet
    assert _arrive(runner) is None  # 4 running + 2 waiting fit
    _hold(runner, 1)
    refused = _arrive(runner)
    assert refused is not None and "queue is full" in refused
    assert "4 requests running (max_num_seqs 4) and 2 waiting (batching.max_queue_size 2)" in refused


def test_without_the_engines_sequence_count_requests_without_tokens_are_the_queue() -> None:
    runner = _runner(slots=None, queue=2)
    _hold(runner, 3, started=True)
    _hold(runner, 1)
    assert _arrive(runner) is None
    _hold(runner, 1)
    assert _arrive(runner) is not None


def test_no_bound_without_max_queue_size() -> None:
    runner = E.EngineRunner(_Sized(1))
    _hold(runner, 100)
    assert _arrive(runner) is None
