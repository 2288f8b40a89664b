"""tritonforge's engine: the TensorRT-LLM engine contract served by vLLM's async engine.

The Triton model (``engine_model``) hands each request to ``VllmEngineRunner``, which runs
vLLM's ``AsyncLLM`` on an asyncio loop in a background thread. vLLM schedules continuously:
a request joins the running batch at its next step and leaves it when done, whatever the
others are doing (in-flight batching). Each request is one coroutine that turns vLLM's delta
outputs into engine-contract responses:

* ``output_ids`` ``[1, beam=1, n]`` -- only the new tokens when streaming, all otherwise;
  the ``end_id`` token is not included (as with the C++ backend);
* ``sequence_length`` ``[1, 1]`` -- n;
* ``finish_reason`` (tritonforge extension) -- "" until the last response.

Stop words arrive as token-id sequences (``stop_words_list``, TensorRT-LLM's ``[2, L]``
format). They are matched on ids here, with hold-back: tokens that might be the start of a
stop word are not streamed until it is clear they are not, so a stop word is never returned,
even partly. Cancellation: the Triton adapter reports ``is_cancelled()``; a watchdog polls it
for every live request, and a cancelled request is aborted in vLLM at once, freeing its KV
cache.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tritonforge.triton_models.errors import RequestError
from tritonforge.contract import LIMITS, FinishReason, SamplingDefaults

__all__ = [
    "EngineRequest",
    "Responder",
    "StopMatcher",
    "VllmEngineRunner",
    "engine_outputs",
    "from_word_list",
    "parse_engine_inputs",
]

log = logging.getLogger("tritonforge.engine")
# A stop that arrives before its request is kept this long (and at most this many).
EARLY_STOP_SECONDS = 60.0
EARLY_STOP_MAX = 4096


def from_word_list(arr: np.ndarray | None) -> list[list[int]]:
    """Inverse of the ``[2, L]`` word-list format (a leading batch dim of 1 is allowed)."""
    if arr is None or arr.size == 0:
        return []
    a = np.asarray(arr)
    if a.ndim == 3:
        a = a[0]
    if a.ndim != 2 or a.shape[0] != 2:
        raise RequestError(f"word lists must have shape [2, L]; got {list(a.shape)}")
    ids, ends = a[0].tolist(), a[1].tolist()
    words: list[list[int]] = []
    start = 0
    for end in ends:
        if end < 0:
            break
        if end < start or end > len(ids):
            raise RequestError("word list offsets must be increasing and within the id row")
        if end > start:
            words.append([int(i) for i in ids[start:end]])
        start = end
    return words


_D = SamplingDefaults()


@dataclass
class EngineRequest:
    """One request in engine-contract terms; absent optional inputs take the contract's
    defaults (``SamplingDefaults``), except streaming (off unless asked for)."""

    input_ids: list[int]
    max_tokens: int
    end_id: int | None = None
    pad_id: int | None = None
    top_k: int = _D.top_k
    top_p: float = _D.top_p
    temperature: float = _D.temperature
    len_penalty: float = _D.length_penalty
    repetition_penalty: float = _D.repetition_penalty
    presence_penalty: float = _D.presence_penalty
    frequency_penalty: float = _D.frequency_penalty
    min_tokens: int = _D.min_tokens
    seed: int | None = None
    beam_width: int = _D.beam_width
    streaming: bool = False
    exclude_input_in_output: bool = _D.exclude_input_in_output
    return_log_probs: bool = False
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    lora_task_id: int = 0


def _scalar(inputs: Mapping[str, np.ndarray | None], name: str) -> Any:
    arr = inputs.get(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0].item()


def parse_engine_inputs(inputs: Mapping[str, np.ndarray | None], *, decoupled: bool) -> EngineRequest:
    """Engine-contract tensors of one request -> EngineRequest; RequestError if unusable."""
    ids_arr = inputs.get("input_ids")
    if ids_arr is None:
        raise RequestError("input_ids is required")
    if ids_arr.ndim == 2 and ids_arr.shape[0] != 1:
        raise RequestError(f"one sequence per request: input_ids has batch size {ids_arr.shape[0]}")
    ids = [int(i) for i in ids_arr.reshape(-1)]
    n = _scalar(inputs, "input_lengths")
    if n is not None:
        if not 0 < int(n) <= len(ids):
            raise RequestError(f"input_lengths ({n}) must be in [1, {len(ids)}] (the input_ids given)")
        ids = ids[: int(n)]
    if not ids:
        raise RequestError("input_ids is empty")
    max_tokens = _scalar(inputs, "request_output_len")
    if max_tokens is None or int(max_tokens) < 1:
        raise RequestError(f"request_output_len must be >= 1; got {max_tokens}")
    req = EngineRequest(input_ids=ids, max_tokens=int(max_tokens))
    ints = {"end_id": "end_id", "pad_id": "pad_id", "runtime_top_k": "top_k",
            "min_tokens": "min_tokens", "beam_width": "beam_width", "seed": "seed",
            "lora_task_id": "lora_task_id"}
    floats = {"runtime_top_p": "top_p", "temperature": "temperature", "len_penalty": "len_penalty",
              "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
              "frequency_penalty": "frequency_penalty"}
    bools = {"streaming": "streaming", "exclude_input_in_output": "exclude_input_in_output",
             "return_log_probs": "return_log_probs"}
    for src, dst in ints.items():
        if (v := _scalar(inputs, src)) is not None:
            setattr(req, dst, int(v))
    for src, dst in floats.items():
        if (v := _scalar(inputs, src)) is not None:
            setattr(req, dst, float(v))
    for src, dst in bools.items():
        if (v := _scalar(inputs, src)) is not None:
            setattr(req, dst, bool(v))
    req.stop_words = from_word_list(inputs.get("stop_words_list"))
    req.bad_words = from_word_list(inputs.get("bad_words_list"))
    if req.beam_width != 1:
        raise RequestError(f"beam_width must be 1 with the vLLM engine (beam search is not supported); got {req.beam_width}")
    if not LIMITS.temperature_min <= req.temperature <= LIMITS.temperature_max:
        raise RequestError(f"temperature must be in [{LIMITS.temperature_min}, {LIMITS.temperature_max}]; got {req.temperature}")
    if not 0.0 < req.top_p <= 1.0:
        raise RequestError(f"runtime_top_p must be in (0, 1]; got {req.top_p}")
    if req.top_k < 0:
        raise RequestError(f"runtime_top_k must be >= 0 (0 disables it); got {req.top_k}")
    if req.min_tokens < 0 or req.min_tokens > req.max_tokens:
        raise RequestError(f"min_tokens must be in [0, request_output_len]; got {req.min_tokens}")
    if not decoupled:
        req.streaming = False
    return req


class StopMatcher:
    """Id-level stop words with hold-back, so a stop word never leaks into the output."""

    def __init__(self, stops: list[list[int]]) -> None:
        self.stops = [s for s in stops if s]
        self.generated: list[int] = []
        self.held = 0  # trailing tokens of `generated` not yet released

    def feed(self, new_ids: list[int]) -> tuple[list[int], bool]:
        """Return (tokens safe to emit, stopped)."""
        if not self.stops:
            return new_ids, False
        for tok in new_ids:
            self.generated.append(tok)
            self.held += 1
            for stop in self.stops:
                if len(self.generated) >= len(stop) and self.generated[-len(stop):] == stop:
                    keep = self.held - len(stop)
                    out = self.generated[len(self.generated) - self.held:len(self.generated) - len(stop)] if keep > 0 else []
                    del self.generated[len(self.generated) - len(stop):]
                    self.held = 0
                    return out, True
        hold = self._partial()
        release = self.held - hold
        out = self.generated[len(self.generated) - self.held:len(self.generated) - hold] if release > 0 else []
        self.held = hold
        return out, False

    def _partial(self) -> int:
        """Length of the longest suffix of `generated` (within held) that starts a stop word."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, self.held), 0, -1):
                if self.generated[-k:] == stop[:k]:
                    best = max(best, k)
                    break
        return best

    def flush(self) -> list[int]:
        out = self.generated[len(self.generated) - self.held:] if self.held else []
        self.held = 0
        return out


class Responder(Protocol):
    """How the runner answers one request (the Triton adapter implements it)."""

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None: ...

    def send_error(self, message: str, *, invalid: bool, cancelled: bool = False) -> None: ...

    def is_cancelled(self) -> bool: ...


def engine_outputs(
    ids: list[int], finish: str, n_input: int, logprobs: list[float] | None = None
) -> dict[str, np.ndarray]:
    lp = logprobs if logprobs is not None else [0.0] * len(ids)
    return {
        "num_input_tokens": np.array([[n_input]], dtype=np.int32),
        "output_ids": np.array([[ids]], dtype=np.int32).reshape(1, 1, len(ids)),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        "cum_log_probs": np.array([[float(sum(lp))]], dtype=np.float32),
        "output_log_probs": np.array([[lp]], dtype=np.float32).reshape(1, 1, len(lp)),
        "finish_reason": np.array([[finish.encode()]], dtype=object),
    }


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


@dataclass
class _Live:
    vllm_id: str
    responder: Responder
    tokens: int
    started: bool = False
    cancelled: bool = False
    task: asyncio.Task[None] | None = None
    client_id: str = ""


class VllmEngineRunner:
    """vLLM's AsyncLLM on a background asyncio loop, speaking the engine contract."""

    def __init__(
        self,
        model_path: str,
        engine_args: Mapping[str, Any],
        *,
        lora_adapters: Mapping[str, Mapping[str, Any]] | None = None,
        metrics: _Metrics | None = None,
        cancel_poll_seconds: float = 0.05,
    ) -> None:
        self.model_path = model_path
        self.engine_args = dict(engine_args)
        self.lora = {int(v["id"]): (name, str(v["path"])) for name, v in (lora_adapters or {}).items()}
        self.metrics = metrics
        self.cancel_poll_seconds = cancel_poll_seconds
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tritonforge-engine", daemon=True)
        self._ids = itertools.count()
        self._live: dict[int, _Live] = {}
        # Stops that named no live request: its request may still be on its way (queued in
        # Triton, or in preprocessing), so it is cancelled on arrival. Bounded in age and count.
        self._early_stops: OrderedDict[str, float] = OrderedDict()
        self._engine: Any = None
        self._tokenizer: Any = None
        self._kv_capacity = 0
        self._watchdog: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._create(), self.loop)
        fut.result()

    async def _create(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        known = set(AsyncEngineArgs.__dataclass_fields__)
        unknown = sorted(set(self.engine_args) - known)
        if unknown:
            raise ValueError(f"unknown vLLM engine arguments: {', '.join(unknown)}")
        args = AsyncEngineArgs(model=self.model_path, **self.engine_args)
        self._engine = AsyncLLM.from_engine_args(args)
        self._tokenizer = self._engine.get_tokenizer()
        with contextlib.suppress(Exception):
            cc = self._engine.vllm_config.cache_config
            self._kv_capacity = int(cc.num_gpu_blocks or 0) * int(cc.block_size or 0)
        self._watchdog = asyncio.create_task(self._watch_cancellations())

    def shutdown(self) -> None:
        if self._engine is not None:
            async def _close() -> None:
                if self._watchdog is not None:
                    self._watchdog.cancel()
                for live in list(self._live.values()):
                    with contextlib.suppress(Exception):
                        await self._engine.abort(live.vllm_id)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_close(), self.loop).result(10)
            with contextlib.suppress(Exception):
                self._engine.shutdown()
            self._engine = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread.is_alive():
            self._thread.join(10)

    # -- requests ------------------------------------------------------------------------
    @property
    def live_requests(self) -> int:
        return len(self._live)

    def submit(
        self, request: EngineRequest, responder: Responder, client_id: str = ""
    ) -> concurrent.futures.Future[None]:
        """Serve one request; ``client_id`` is Triton's request id (what ``stop`` names)."""
        return asyncio.run_coroutine_threadsafe(self._serve(request, responder, client_id), self.loop)

    def stop(self, client_id: str) -> concurrent.futures.Future[int]:
        """Cancel the live requests with this Triton request id (the engine contract's
        ``stop`` input, as the TensorRT-LLM backend does); resolves to how many there were."""
        return asyncio.run_coroutine_threadsafe(self._stop(client_id), self.loop)

    async def _stop(self, client_id: str) -> int:
        hits = [lv for lv in self._live.values() if client_id and lv.client_id == client_id]
        if client_id and not hits:
            self._early_stops[client_id] = time.monotonic()
            self._early_stops.move_to_end(client_id)
            while len(self._early_stops) > EARLY_STOP_MAX:
                self._early_stops.popitem(last=False)
        for live in hits:
            if live.cancelled:
                continue
            live.cancelled = True
            with contextlib.suppress(Exception):
                await self._engine.abort(live.vllm_id)
            if live.task is not None:
                live.task.cancel()
        return len(hits)

    def _stopped_before_arrival(self, client_id: str) -> bool:
        """Whether a stop for ``client_id`` came before its request (consumes the stop)."""
        now = time.monotonic()
        while self._early_stops and now - next(iter(self._early_stops.values())) > EARLY_STOP_SECONDS:
            self._early_stops.popitem(last=False)
        return bool(client_id) and self._early_stops.pop(client_id, None) is not None

    def _sampling_params(self, req: EngineRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop_ids: list[int] = []
        eos = getattr(self._tokenizer, "eos_token_id", None)
        if req.end_id is not None and req.end_id != eos:
            stop_ids.append(req.end_id)
        bad = [self._tokenizer.decode(w) for w in req.bad_words] if req.bad_words else None
        return SamplingParams(
            n=1,
            max_tokens=req.max_tokens,
            min_tokens=req.min_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            stop_token_ids=stop_ids or None,
            bad_words=bad,
            logprobs=0 if req.return_log_probs else None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _complete_text(self, ids: list[int]) -> bool:
        """True when ``ids`` end on a character boundary: streamed chunks never split a
        multi-byte character, so even a stateless detokenizer decodes each chunk exactly."""
        try:
            return not str(self._tokenizer.decode(ids)).endswith("\ufffd")
        except Exception:
            return True

    def _update_gauges(self) -> None:
        if self.metrics is None:
            return
        running = sum(1 for lv in self._live.values() if lv.started)
        self.metrics.set_running(running)
        self.metrics.set_waiting(len(self._live) - running)
        if self._kv_capacity:
            used = sum(lv.tokens for lv in self._live.values())
            self.metrics.set_kv_cache_usage(min(1.0, used / self._kv_capacity))

    async def _watch_cancellations(self) -> None:
        while True:
            await asyncio.sleep(self.cancel_poll_seconds)
            for live in list(self._live.values()):
                if live.cancelled:
                    continue
                try:
                    cancelled = live.responder.is_cancelled()
                except Exception:  # the request is gone on the server side
                    cancelled = True
                if cancelled:
                    live.cancelled = True
                    with contextlib.suppress(Exception):
                        await self._engine.abort(live.vllm_id)
                    if live.task is not None:
                        live.task.cancel()  # wake the request's coroutine wherever it waits

    async def _serve(self, req: EngineRequest, responder: Responder, client_id: str = "") -> None:
        key = next(self._ids)
        vllm_id = f"tf-{os.getpid()}-{key}"
        live = _Live(vllm_id, responder, len(req.input_ids), task=asyncio.current_task(),
                     client_id=client_id)
        self._live[key] = live
        self._update_gauges()
        arrived = time.monotonic()
        first_at: float | None = None
        generated = 0
        finish = ""
        stopper = StopMatcher(req.stop_words)
        n_in = len(req.input_ids)
        pending: list[int] = list(req.input_ids) if not req.exclude_input_in_output else []
        pending_lp: list[float] = [0.0] * len(pending)
        try:
            if self._stopped_before_arrival(client_id):
                live.cancelled = True
                raise asyncio.CancelledError  # answered as cancelled below; never reaches vLLM
            try:
                params = self._sampling_params(req)
            except Exception as exc:  # vLLM's own validation of sampling values
                raise RequestError(str(exc)) from None
            lora_request = None
            if req.lora_task_id:
                if req.lora_task_id not in self.lora:
                    raise RequestError(f"lora_task_id {req.lora_task_id} is not a configured adapter")
                from vllm.lora.request import LoRARequest

                name, path = self.lora[req.lora_task_id]
                lora_request = LoRARequest(name, req.lora_task_id, path)
            stream = self._engine.generate(
                {"prompt_token_ids": req.input_ids}, params, request_id=vllm_id,
                lora_request=lora_request,
            )
            async for out in stream:
                if live.cancelled:
                    break
                comp = out.outputs[0]
                new = [int(t) for t in comp.token_ids]
                lps: list[float] = []
                if req.return_log_probs and comp.logprobs:
                    for tok, entry in zip(new, comp.logprobs):
                        lp = entry.get(tok) if entry else None
                        lps.append(float(lp.logprob) if lp is not None else 0.0)
                if new and first_at is None:
                    first_at = time.monotonic()
                    live.started = True
                    if self.metrics:
                        self.metrics.observe_ttft(first_at - arrived)
                        self.metrics.add_prompt_tokens(len(req.input_ids))
                generated += len(new)
                live.tokens += len(new)
                if comp.finish_reason is not None and new and req.end_id is not None and new[-1] == req.end_id:
                    new = new[:-1]  # the C++ backend does not return end_id either
                elif comp.finish_reason == "stop" and new and new[-1] == getattr(self._tokenizer, "eos_token_id", None):
                    new = new[:-1]
                emit, stopped = stopper.feed(new)
                pending.extend(emit)
                if req.return_log_probs:
                    pending_lp.extend(lps[: len(emit)])
                if stopped:
                    finish = FinishReason.STOP.value
                    with contextlib.suppress(Exception):
                        await self._engine.abort(vllm_id)
                    break
                if comp.finish_reason is not None:
                    pending.extend(stopper.flush())
                    finish = FinishReason.LENGTH.value if comp.finish_reason == "length" else FinishReason.STOP.value
                    if comp.finish_reason == "abort":
                        finish = FinishReason.CANCELLED.value
                    break
                if req.streaming and pending:
                    if self._complete_text(pending):
                        responder.send(engine_outputs(pending, "", n_in, pending_lp if req.return_log_probs else None), final=False)
                        pending, pending_lp = [], []
                self._update_gauges()
            if live.cancelled:
                with contextlib.suppress(Exception):
                    await self._engine.abort(vllm_id)
                finish = FinishReason.CANCELLED.value
                responder.send_error("request cancelled", invalid=False, cancelled=True)
            else:
                if not finish:
                    finish = FinishReason.LENGTH.value if generated >= req.max_tokens else FinishReason.STOP.value
                responder.send(engine_outputs(pending, finish, n_in, pending_lp if req.return_log_probs else None), final=True)
        except RequestError as exc:
            finish = "error"
            responder.send_error(str(exc), invalid=True)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._engine.abort(vllm_id)
            finish = FinishReason.CANCELLED.value
            with contextlib.suppress(Exception):
                responder.send_error("request cancelled", invalid=False, cancelled=True)
            if not live.cancelled:  # the runner is shutting down, not a client cancel
                raise
        except Exception as exc:  # engine failure: answer, keep serving
            log.exception("engine request failed")
            finish = "error"
            with contextlib.suppress(Exception):
                await self._engine.abort(vllm_id)
            with contextlib.suppress(Exception):
                responder.send_error(f"engine error: {exc}", invalid=False)
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
