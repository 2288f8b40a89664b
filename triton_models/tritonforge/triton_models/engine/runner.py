"""The engine skeleton: one request lifecycle for every engine, one adapter per engine.

The Triton model (``engine_model``) hands each request to :class:`EngineRunner`, which runs
an engine adapter (:mod:`.vllm` for vLLM's ``AsyncLLM``; a TensorRT-LLM LLM-API adapter
speaks the same :class:`EngineAdapter` protocol) on an asyncio loop in a background thread.
The engine schedules continuously (in-flight batching); each request is one coroutine that
turns the adapter's token deltas into engine-contract responses:

* ``output_ids`` ``[1, beam=1, n]`` -- only the new tokens when streaming, all otherwise;
  the ``end_id`` token is not included (as with the C++ backend);
* ``sequence_length`` ``[1, 1]`` -- n;
* ``finish_reason`` (tritonforge extension) -- "" until the last response.

What the skeleton does for every engine: stop words matched on token ids with hold-back (a
stop word is never returned, even partly); streamed chunks cut on character boundaries;
cancellation (a watchdog polls each live request's ``is_cancelled()``; the contract's
``stop`` input cancels by the client's request id or by the engine's own request id
(``contract.engine_request_id``), also when it arrives before its request); draining at
shutdown; metrics.

What the engine is doing is read from the engine itself, not from this runner's books: an
adapter with a ``scheduler_state()`` (vLLM's stat loggers: the scheduler's running and
waiting counts and KV-cache usage after each step) drives the running/waiting/KV gauges, so
a request the engine keeps generating for shows there even if this runner has let it go. An
abort the engine refuses is logged and counted (``tritonforge_engine_abort_failures_total``).

Draining: when the file named by ``$TRITONFORGE_DRAIN_FILE`` appears (``tritonforge serve``
writes it when asked to stop, before it signals the server), every live request is ended
with a NOT_READY "server is shutting down" error and new ones are refused the same way, so
Triton has no in-flight request left to wait for and exits at once.

The runner is also usable in-process without Triton (benchmarks compare the two).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import astuple, dataclass
from typing import Any, Protocol

import numpy as np
from tritonforge.contract import (
    DRAIN_FILE_ENV,
    ErrorKind,
    FinishReason,
    engine_request_id,
    format_error,
)
from tritonforge.triton_models.engine.request import EngineRequest, StopMatcher, engine_outputs
from tritonforge.triton_models.errors import ModelError
from tritonforge.triton_models.pacing import (
    GAUGE_MIN_SECONDS,
    cancel_check_seconds,
    coalesce_interval,
)

__all__ = ["Delta", "EngineAdapter", "EngineCounts", "EngineRunner", "Responder", "SchedulerState"]

log = logging.getLogger("tritonforge.engine")
# A stop that arrives before its request is kept this long (and at most this many).
EARLY_STOP_SECONDS = 60.0
EARLY_STOP_MAX = 4096
# An engine whose scheduler has reported nothing for this long has run no step: it holds no
# request (a busy engine reports after every step, well under a second apart).
IDLE_AFTER_SECONDS = 5.0
# Token ids whose completeness as a one-token chunk is remembered (the vocabulary, bounded).
COMPLETE_IDS_MAX = 1 << 20
SHUTTING_DOWN = "server is shutting down"
ENGINE_DIED = "the inference engine has died; the server must be restarted"


@dataclass
class Delta:
    """What an engine produced for one request since its last delta."""

    token_ids: list[int]
    logprobs: list[float] | None = None  # the log-probability of each token, when asked for
    finish: str | None = None  # None while running; "stop", "length" or "abort" at the end
    top: list[list[tuple[int, float]]] | None = None  # per token: its alternatives (top_logprobs)
    index: int = 0  # which of the request's num_return_sequences sequences


class TokenizerAdapter:
    """What both engine adapters answer from the engine's own tokenizer (set in ``start``)."""

    tokenizer: Any = None

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return None if eos is None else int(eos)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))


class EngineAdapter(Protocol):
    """What the skeleton needs of an engine (vLLM's AsyncLLM, TensorRT-LLM's LLM API)."""

    async def start(self) -> None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def decode(self, ids: list[int]) -> str: ...

    @property
    def kv_capacity_tokens(self) -> int: ...

    def generate(self, req: EngineRequest, request_id: str) -> AsyncIterator[Delta]: ...

    async def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...


class Responder(Protocol):
    """How the runner answers one request (the Triton adapter implements it)."""

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None: ...

    def send_error(self, kind: ErrorKind, message: str, param: str | None = None) -> None: ...

    def is_cancelled(self) -> bool: ...


class _Metrics(Protocol):
    def observe_ttft(self, seconds: float) -> None: ...
    def observe_time_per_output_token(self, seconds: float) -> None: ...
    def observe_e2e(self, seconds: float) -> None: ...
    def add_prompt_tokens(self, n: int) -> None: ...
    def add_generation_tokens(self, n: int) -> None: ...
    def set_running(self, n: int) -> None: ...
    def set_waiting(self, n: int) -> None: ...
    def set_kv_cache_usage(self, fraction: float) -> None: ...
    def add_request_finished(self, finish_reason: str) -> None: ...
    def add_abort_failure(self) -> None: ...
    def set_engine_up(self, up: bool) -> None: ...
    def add_queue_full_rejection(self) -> None: ...
    def add_engine_counts(self, delta: EngineCounts) -> None: ...


@dataclass(frozen=True)
class SchedulerState:
    """The engine scheduler's own counts, as it last reported them."""

    running: int
    waiting: int
    kv_cache_usage: float
    age_seconds: float  # since the report; an idle engine reports nothing


@dataclass(frozen=True)
class EngineCounts:
    """The engine's own running totals (vLLM's scheduler stats), exported as counters:
    prompt tokens looked up in / found in the prefix cache, and speculative drafts, drafted
    tokens and accepted drafted tokens."""

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def minus(self, other: EngineCounts) -> EngineCounts:
        return EngineCounts(*(max(0, a - b) for a, b in zip(astuple(self), astuple(other))))


@dataclass
class _Live:
    key: int
    engine_id: str
    responder: Responder
    tokens: int
    started: bool = False
    cancelled: bool = False
    task: asyncio.Task[None] | None = None
    client_id: str = ""
    cancel_kind: ErrorKind = ErrorKind.CANCELLED
    cancel_message: str = "request cancelled"
    cancel_checked: float = 0.0  # monotonic time of the last is_cancelled() asked


class _Sequence:
    """One sequence of a request (``num_return_sequences`` of them) on its way out: the
    tokens not sent yet, the stop-word matcher's hold-back, and the log-probabilities (and
    alternatives) of both, in order -- a held token's go out with it, a stop word's are
    dropped with it."""

    def __init__(self, index: int, stops: list[list[int]], echo: list[int]) -> None:
        self.index = index
        self.stopper = StopMatcher(stops)
        self.pending = list(echo)  # an echoed prompt comes first, log-probability 0
        self.pending_lp: list[float] = [0.0] * len(echo)
        self.pending_top: list[list[tuple[int, float]]] = [[] for _ in echo]
        self.held_lp: list[float] = []
        self.held_top: list[list[tuple[int, float]]] = []
        self.generated = 0
        self.finish = ""
        self.last_sent: float | None = None  # when a response of it last went out

    def hold(self, new: list[int], lps: list[float], top: list[list[tuple[int, float]]]) -> None:
        """Record the log-probabilities of ``new`` before they go to the stop matcher."""
        self.held_lp.extend((lps + [0.0] * len(new))[: len(new)])
        self.held_top.extend((top + [[]] * len(new))[: len(new)])

    def _release(self, ids: list[int]) -> None:
        self.pending.extend(ids)
        n = len(ids)
        self.pending_lp.extend(self.held_lp[:n])
        self.pending_top.extend(self.held_top[:n])
        del self.held_lp[:n], self.held_top[:n]

    def feed(self, new: list[int], *, cpp: bool) -> bool:
        """Pass ``new`` through the stop matcher; whether a stop word ended the sequence."""
        emit, stopped = self.stopper.feed(new)
        self._release(new if cpp else emit)  # the C++ backend returns the stop word too
        return stopped

    def flush(self) -> None:
        self._release(self.stopper.flush())

    def take(self) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        out = (self.pending, self.pending_lp, self.pending_top)
        self.pending, self.pending_lp, self.pending_top = [], [], []
        return out


def _new_loop() -> asyncio.AbstractEventLoop:
    """The engine thread's event loop: uvloop's when installed (vLLM installs it; ``vllm
    serve`` runs its engine client on it too), else asyncio's. Every streamed token wakes this
    loop several times (vLLM's output socket, its output handler, the request's generator)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class EngineRunner:
    """An engine adapter on a background asyncio loop, speaking the engine contract."""

    def __init__(
        self,
        adapter: EngineAdapter,
        *,
        metrics: _Metrics | None = None,
        cancel_poll_seconds: float = 0.05,
        max_queue_size: int | None = None,
        cpp_outputs: bool = False,
        stream_interval_s: float = 0.0,
        coalesce_from: int = 1,
    ) -> None:
        self.adapter = adapter
        # Coalescing of streamed deltas: once at least ``coalesce_from`` requests are live, a
        # sequence's tokens go out at most every ``stream_interval_s``, stretched with the live
        # requests (pacing.coalesce_interval; its first response and its last never wait): each
        # response crosses the engine stub, tritonserver and postprocessing, so under load
        # fewer, fuller responses leave more CPU to the engine.
        self.stream_interval_s = stream_interval_s
        self.coalesce_from = max(1, coalesce_from)
        self.max_queue_size = max_queue_size
        # Answer as NVIDIA's C++ backend does (the CPU stand-in for it): every token streamed
        # as generated, a matched stop word returned, end_id left out; the stream's last
        # response is then empty when generation ended at end_id.
        self.cpp_outputs = cpp_outputs
        self.metrics = metrics
        self.cancel_poll_seconds = cancel_poll_seconds
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tritonforge-engine", daemon=True)
        # Keys are unique per engine model and unguessable across restarts.
        self._key_base = (int.from_bytes(os.urandom(4), "big") & 0x7FFFFFFF) << 32
        self._ids = itertools.count(1)
        self._draining = False
        self._dead = False
        self._drain_file = os.environ.get(DRAIN_FILE_ENV) or None
        self._gauges: tuple[float, float, float] | None = None
        self._gauges_sent = 0.0
        self._counts = EngineCounts()
        self._live: dict[int, _Live] = {}
        self._complete_ids: dict[int, bool] = {}  # token id -> decodes alone without U+FFFD
        # Stops that named no live request: its request may still be on its way (queued in
        # Triton, or in preprocessing), so it is cancelled on arrival. Bounded in age and count.
        self._early_stops: OrderedDict[str, float] = OrderedDict()
        self._started = False
        self._watchdog: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._create(), self.loop).result()

    async def _create(self) -> None:
        await self.adapter.start()
        self._started = True
        self._watchdog = asyncio.create_task(self._watch_cancellations())

    def shutdown(self) -> None:
        if self._started:
            async def _close() -> None:
                if self._watchdog is not None:
                    self._watchdog.cancel()
                for live in list(self._live.values()):
                    await self._abort(live.engine_id)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_close(), self.loop).result(10)
            try:
                self.adapter.shutdown()
            except Exception:
                log.exception("engine shutdown failed")
            self._started = False

            async def _cancel_tasks() -> None:
                # The engine's own tasks (vLLM's output handler) would otherwise be torn down
                # half-run by the interpreter's exit, which crashes the stub at exit.
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=5)

            if self.loop.is_running():
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(_cancel_tasks(), self.loop).result(10)
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread.is_alive():
            self._thread.join(10)
        if not self.loop.is_running() and not self.loop.is_closed():
            with contextlib.suppress(Exception):
                self.loop.close()

    # -- requests ------------------------------------------------------------------------
    def submit(
        self, request: EngineRequest, responder: Responder, client_id: str = ""
    ) -> concurrent.futures.Future[None]:
        """Serve one request; ``client_id`` is Triton's request id (what ``stop`` names)."""
        return asyncio.run_coroutine_threadsafe(self._serve(request, responder, client_id), self.loop)

    def stop(self, client_id: str) -> concurrent.futures.Future[int]:
        """Cancel the live requests with this Triton request id (the engine contract's
        ``stop`` input, as the TensorRT-LLM backend does); resolves to how many there were."""
        return asyncio.run_coroutine_threadsafe(self._stop(client_id), self.loop)

    async def _abort(self, engine_id: str) -> bool:
        """Abort in the engine; a failure is logged and counted, never hidden."""
        if self._dead:
            return False  # the request went with the engine
        try:
            await self.adapter.abort(engine_id)
            return True
        except Exception:
            log.exception("engine abort of %s failed: the engine may still be generating for it", engine_id)
            if self.metrics is not None:
                self.metrics.add_abort_failure()
            return False

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> concurrent.futures.Future[int]:
        """End every live request with a "shutting down" error and refuse new ones."""
        return asyncio.run_coroutine_threadsafe(self._drain(), self.loop)

    async def _drain(self) -> int:
        if not self._draining:
            log.info("draining: ending %d live request(s), refusing new ones", len(self._live))
        self._draining = True
        lives = list(self._live.values())
        for live in lives:
            if self._cancel(live, ErrorKind.NOT_READY, SHUTTING_DOWN):
                await self._abort(live.engine_id)
        return len(lives)

    def _cancel(self, live: _Live, kind: ErrorKind = ErrorKind.CANCELLED,
                message: str = "request cancelled") -> bool:
        if live.cancelled:
            return False
        live.cancelled = True
        live.cancel_kind, live.cancel_message = kind, message
        if live.task is not None:
            live.task.cancel()  # wake the request's coroutine wherever it waits
        return True

    async def _stop(self, client_id: str) -> int:
        hits = [lv for lv in self._live.values()
                if client_id and client_id in (lv.client_id, lv.engine_id)]
        if client_id and not hits:
            self._early_stops[client_id] = time.monotonic()
            self._early_stops.move_to_end(client_id)
            while len(self._early_stops) > EARLY_STOP_MAX:
                self._early_stops.popitem(last=False)
        for live in hits:
            if self._cancel(live):
                await self._abort(live.engine_id)
        return len(hits)

    def _stopped_before_arrival(self, client_id: str) -> bool:
        """Whether a stop for ``client_id`` came before its request (consumes the stop)."""
        now = time.monotonic()
        while self._early_stops and now - next(iter(self._early_stops.values())) > EARLY_STOP_SECONDS:
            self._early_stops.popitem(last=False)
        return bool(client_id) and self._early_stops.pop(client_id, None) is not None

    def _complete_text(self, ids: list[int]) -> bool:
        """True when ``ids`` end on a character boundary: streamed chunks never split a
        multi-byte character, so even a stateless detokenizer decodes each chunk exactly.
        (A chunk starts on a boundary, so a one-token chunk's answer is the token's own:
        remembered per token id, one decode per distinct token instead of one per token.)"""
        one = ids[0] if len(ids) == 1 else None
        if one is not None and (known := self._complete_ids.get(one)) is not None:
            return known
        try:
            complete = not self.adapter.decode(ids).endswith("\ufffd")
        except Exception:
            complete = True
        if one is not None and len(self._complete_ids) < COMPLETE_IDS_MAX:
            self._complete_ids[one] = complete
        return complete

    def _hold_back(self, seq: _Sequence, now: float) -> bool:
        """Whether ``seq``'s pending tokens wait for the next delta (coalescing, see
        ``pacing.coalesce_interval``): never its first response."""
        return (seq.last_sent is not None
                and now - seq.last_sent < coalesce_interval(self.stream_interval_s, len(self._live),
                                                            self.coalesce_from))

    def _update_gauges(self) -> None:
        """Running/waiting/KV gauges: the engine scheduler's own report when the adapter has
        one (an engine that has run no step for ``IDLE_AFTER_SECONDS`` holds no request:
        a busy engine reports after every step), else this runner's count."""
        if self.metrics is None:
            return
        state_of = getattr(self.adapter, "scheduler_state", None)
        state: SchedulerState | None = state_of() if state_of is not None else None
        if state is not None:
            if state.age_seconds > IDLE_AFTER_SECONDS:
                values = (0.0, 0.0, 0.0)
            else:
                values = (float(state.running), float(state.waiting), float(state.kv_cache_usage))
        else:
            running = sum(1 for lv in self._live.values() if lv.started)
            capacity = self.adapter.kv_capacity_tokens
            used = sum(lv.tokens for lv in self._live.values())
            values = (float(running), float(len(self._live) - running),
                      min(1.0, used / capacity) if capacity else 0.0)
        if values == self._gauges:
            return
        # KV usage moves every engine step: at most every GAUGE_MIN_SECONDS (each update is an
        # IPC round trip), except that running or waiting changed or the engine went idle.
        now = time.monotonic()
        if (self._gauges is not None and values[:2] == self._gauges[:2] and any(values)
                and now - self._gauges_sent < GAUGE_MIN_SECONDS):
            return
        self._gauges, self._gauges_sent = values, now
        self.metrics.set_running(int(values[0]))
        self.metrics.set_waiting(int(values[1]))
        self.metrics.set_kv_cache_usage(values[2])

    def _update_counters(self) -> None:
        """Add what the engine's own totals (``engine_counts()``) grew by since last time."""
        counts_of = getattr(self.adapter, "engine_counts", None)
        if self.metrics is None or counts_of is None:
            return
        now: EngineCounts = counts_of()
        if now != self._counts:
            delta, self._counts = now.minus(self._counts), now
            self.metrics.add_engine_counts(delta)

    def _queue_full(self, live: _Live) -> str | None:
        """Why ``live`` is refused by ``max_queue_size`` (None: admitted). With the engine's
        ``max_num_seqs`` known, the engine may hold that many running requests plus
        ``max_queue_size`` waiting ones; without it, requests that have not started count."""
        if self.max_queue_size is None:
            return None
        others = [lv for lv in self._live.values() if lv is not live]
        slots = getattr(self.adapter, "max_num_seqs", None)
        if slots:
            waiting = len(others) - int(slots)
            if waiting < self.max_queue_size:
                return None
            return (f"the engine's queue is full: {slots} requests running (max_num_seqs "
                    f"{slots}) and {waiting} waiting (batching.max_queue_size "
                    f"{self.max_queue_size}); retry later")
        waiting = sum(1 for lv in others if not lv.started)
        if waiting < self.max_queue_size:
            return None
        return (f"the engine's queue is full ({waiting} requests waiting, "
                f"batching.max_queue_size {self.max_queue_size}); retry later")

    @staticmethod
    def _fail(responder: Responder, kind: ErrorKind, message: str, param: str | None = None, *,
              streamed: bool, key: int, n_in: int) -> None:
        """Answer a request that ends without its output: an error response while nothing has
        been sent; once it has streamed, a final response -- finish_reason "cancelled", or
        "error" with the tagged error in ``error`` -- so that the error is the ensemble's last
        step (see ``contract.ENGINE_EXTRA_OUTPUTS``).

        A stream the server ends at shutdown (NOT_READY) also gets the "cancelled" final
        response, not an error: measured on Triton 2.51, an ensemble error after streamed
        responses on a gRPC stream keeps the ensemble from unloading, and the server then
        waits out its exit timeout and exits 1."""
        if not streamed:
            responder.send_error(kind, message, param)
        elif kind in (ErrorKind.CANCELLED, ErrorKind.NOT_READY):
            responder.send(engine_outputs([], FinishReason.CANCELLED.value, n_in, key=key), final=True)
        else:
            responder.send(engine_outputs([], FinishReason.ERROR.value, n_in, key=key,
                                          error=format_error(kind, message, param)), final=True)

    def _cpp_cancelled(self, responder: Responder, req: EngineRequest, seqs: dict[int, _Sequence],
                       streamed: bool) -> bool:
        """As the C++ backend ends a cancelled request of several sequences that has streamed:
        every sequence still running gets its last (empty) response, with its
        sequence_index, the request's last one flagged final (the executor's result of each
        sequence, ``isFinal`` once all are). Whether it answered (else ``_fail`` does)."""
        if not (self.cpp_outputs and streamed and req.n > 1):
            return False
        running = [i for i in range(req.n) if i not in seqs or not seqs[i].finish]
        for j, i in enumerate(running):
            out = engine_outputs([], "", 0, sequence=i, every=True)
            for name in ("output_log_probs", "cum_log_probs"):
                out.pop(name)
            responder.send(out, final=j == len(running) - 1)
        return bool(running)

    async def _watch_cancellations(self) -> None:
        while True:
            await asyncio.sleep(self.cancel_poll_seconds)
            if not self._draining and self._drain_file and os.path.exists(self._drain_file):
                await self._drain()
            # The gauges follow the engine's own report here, every poll, not per token.
            if not self._dead and getattr(self.adapter, "dead", False):
                self._dead = True
                log.error("the inference engine has died: every request is refused from now on")
                if self.metrics is not None:
                    self.metrics.set_engine_up(False)
                for live in list(self._live.values()):
                    self._cancel(live, ErrorKind.NOT_READY, ENGINE_DIED)
            self._update_gauges()
            self._update_counters()
            # Each is_cancelled() is an IPC round trip to tritonserver: every request is asked
            # every cancel_check_seconds(live), which stretches with load (pacing.py).
            now = time.monotonic()
            every = cancel_check_seconds(len(self._live))
            for live in list(self._live.values()):
                if live.cancelled or now - live.cancel_checked < every:
                    continue
                live.cancel_checked = now
                try:
                    cancelled = live.responder.is_cancelled()
                except Exception:  # the request is gone on the server side
                    cancelled = True
                if cancelled and self._cancel(live):
                    await self._abort(live.engine_id)

    async def _serve(self, req: EngineRequest, responder: Responder, client_id: str = "") -> None:
        key = self._key_base | next(self._ids)
        engine_id = engine_request_id(key)
        live = _Live(key, engine_id, responder, len(req.input_ids), task=asyncio.current_task(),
                     client_id=client_id)
        self._live[key] = live
        self._update_gauges()
        arrived = time.monotonic()
        first_at: float | None = None
        generated = 0
        finish = ""
        n_in = len(req.input_ids)
        eos = self.adapter.eos_token_id
        echo = list(req.input_ids) if not req.exclude_input_in_output else []
        seqs: dict[int, _Sequence] = {}
        finished = 0  # sequences that have ended
        last_seq: _Sequence | None = None  # the last of them, once all have
        cut = False  # whether a stop word ended one (the engine goes on with it)

        def outputs(seq: _Sequence, reason: str) -> dict[str, np.ndarray]:
            asked = req.return_log_probs
            ids, lps, top = seq.take()
            out = engine_outputs(ids, reason, n_in, lps if asked else None, key,
                                 top=top if asked and req.top_logprobs else None, sequence=seq.index,
                                 every=self.cpp_outputs)
            if self.cpp_outputs:  # as the C++ backend: these only when asked for / n > 1
                for name, sent in (("sequence_index", req.n > 1), ("output_log_probs", asked),
                                   ("cum_log_probs", asked)):
                    if not sent:
                        del out[name]
            return out
        streamed = False  # whether a response has gone out (then failures are answered in-band)
        try:
            if self._draining or self._dead:
                self._cancel(live, ErrorKind.NOT_READY, SHUTTING_DOWN if self._draining else ENGINE_DIED)
                raise asyncio.CancelledError  # answered below; never reaches the engine
            if (full := self._queue_full(live)) is not None:
                if self.metrics is not None:
                    self.metrics.add_queue_full_rejection()
                raise ModelError(full, kind=ErrorKind.OVERLOADED)
            if self._stopped_before_arrival(client_id):
                live.cancelled = True
                raise asyncio.CancelledError  # answered as cancelled below; never reaches the engine
            async for delta in self.adapter.generate(req, engine_id):
                if live.cancelled:
                    break
                seq = seqs.get(delta.index)
                if seq is None:
                    seq = seqs[delta.index] = _Sequence(delta.index, req.stop_words, echo)
                if seq.finish:
                    continue  # it matched a stop word: what the engine adds is dropped
                new = list(delta.token_ids)
                if new and first_at is None:
                    first_at = time.monotonic()
                    live.started = True
                    if self.metrics:
                        self.metrics.observe_ttft(first_at - arrived)
                        self.metrics.add_prompt_tokens(len(req.input_ids))
                generated += len(new)
                seq.generated += len(new)
                live.tokens += len(new)
                if delta.finish is not None and new and req.end_id is not None and new[-1] == req.end_id:
                    new = new[:-1]  # the C++ backend does not return end_id either
                elif delta.finish == "stop" and new and new[-1] == eos:
                    new = new[:-1]
                if req.return_log_probs:
                    seq.hold(new, list(delta.logprobs or ()), list(delta.top or ()))
                stopped = seq.feed(new, cpp=self.cpp_outputs)
                if stopped:
                    seq.finish = FinishReason.STOP.value
                    cut = True
                elif delta.finish is not None:
                    if not self.cpp_outputs:  # (cpp_outputs sent what the matcher held already)
                        seq.flush()
                    seq.finish = {"length": FinishReason.LENGTH.value,
                                  "abort": FinishReason.CANCELLED.value}.get(delta.finish, FinishReason.STOP.value)
                if seq.finish:
                    finished += 1
                    finish = seq.finish
                    if finished == req.n:
                        last_seq = seq
                        if cut:  # a sequence the engine may still be generating for
                            await self._abort(engine_id)
                        break
                    responder.send(outputs(seq, seq.finish), final=False)  # the others go on
                    streamed = True
                    continue
                if req.streaming and seq.pending:
                    now = time.monotonic()
                    if self._hold_back(seq, now) or not (self.cpp_outputs or self._complete_text(seq.pending)):
                        continue
                    seq.last_sent = now
                    responder.send(outputs(seq, ""), final=False)
                    streamed = True
            if live.cancelled:
                await self._abort(engine_id)
                finish = FinishReason.CANCELLED.value
                if not self._cpp_cancelled(responder, req, seqs, streamed):
                    self._fail(responder, live.cancel_kind, live.cancel_message, streamed=streamed, key=key, n_in=n_in)
            else:
                # The last response: the sequence that finished last, or those the engine's
                # stream ended without a reason (it gets theirs from their length).
                ends = [last_seq] if last_seq is not None else [q for q in seqs.values() if not q.finish]
                if not ends:
                    ends = [_Sequence(0, [], echo)]
                for i, q in enumerate(ends):
                    if not q.finish:
                        q.finish = FinishReason.LENGTH.value if q.generated >= req.max_tokens else FinishReason.STOP.value
                    responder.send(outputs(q, q.finish), final=i == len(ends) - 1)
                finish = ends[-1].finish
        except ModelError as exc:
            finish = "error"
            self._fail(responder, exc.kind, str(exc), exc.param, streamed=streamed, key=key, n_in=n_in)
        except asyncio.CancelledError:
            await self._abort(engine_id)
            finish = FinishReason.CANCELLED.value
            with contextlib.suppress(Exception):
                if not self._cpp_cancelled(responder, req, seqs, streamed):
                    self._fail(responder, live.cancel_kind, live.cancel_message, streamed=streamed, key=key,
                               n_in=n_in)
            if not live.cancelled:  # the runner is shutting down, not a client cancel
                raise
        except Exception as exc:  # engine failure: answer, keep serving
            log.exception("engine request failed")
            finish = "error"
            await self._abort(engine_id)
            with contextlib.suppress(Exception):
                self._fail(responder, ErrorKind.ENGINE_FAILURE, f"engine error: {exc}", streamed=streamed,
                           key=key, n_in=n_in)
        finally:
            self._live.pop(key, None)
            done = time.monotonic()
            if self.metrics:
                self.metrics.add_request_finished(finish or "error")
                if first_at is not None:
                    self.metrics.observe_e2e(done - arrived)
                    self.metrics.add_generation_tokens(generated)
                    if generated > 1:
                        self.metrics.observe_time_per_output_token((done - first_at) / (generated - 1))
            self._update_gauges()

