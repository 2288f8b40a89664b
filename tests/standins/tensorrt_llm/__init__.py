"""A STAND-IN for TensorRT-LLM's LLM API, for tests on machines without a GPU.

This is not TensorRT-LLM. It exposes exactly the part of ``tensorrt_llm``'s public API that
tritonforge's LLM-API engine adapter (``tritonforge.triton_models.engine.trtllm_llmapi``)
uses, with the names and signatures of TensorRT-LLM's own source --
``tensorrt_llm/llmapi/llm.py`` (``LLM.__init__``, ``LLM.generate_async``, ``LLM.tokenizer``,
``LLM.shutdown``), ``tensorrt_llm/executor/result.py`` (``RequestOutput`` /
``GenerationResult``: async iteration one step at a time, ``finished``, ``abort()``,
``aborted()``, ``CompletionOutput.token_ids_diff`` / ``logprobs_diff`` / ``finish_reason``
in ``'stop' | 'length' | 'timeout' | 'cancelled'``), ``tensorrt_llm/sampling_params.py``
(``SamplingParams``: a keyword-only dataclass; unknown fields are refused) and
``tensorrt_llm/executor/request.py`` (``LoRARequest``) -- and drives REAL tokens from the
real vLLM CPU engine underneath (``vllm.v1.engine.async_llm.AsyncLLM``), so a test serves
real text through the adapter on the real tritonserver.

What it translates: ``LLM()`` arguments to vLLM engine arguments (``max_batch_size`` ->
``max_num_seqs``, ``max_seq_len`` -> ``max_model_len``, ``kv_cache_config.enable_block_reuse``
-> ``enable_prefix_caching``, LoRA limits; always eager on CPU), TensorRT-LLM's greedy
(``top_k == 1``) to vLLM's (``temperature == 0``), ``end_id`` to a stop token. Arguments
TensorRT-LLM has and vLLM cannot honour (TP/PP across GPUs, speculative configs) are
accepted and recorded, not run.

Its own record: with ``$TRTLLM_STANDIN_RECORD`` set, every ``LLM()``, ``generate_async`` and
``abort()`` appends a JSON line there (``{"event": "abort", "request_id": ...}``), the
"engine side" a test reads to see that a cancellation reached the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["LLM", "STANDIN", "RequestOutput", "SamplingParams"]

STANDIN = True  # what makes this package recognisable as the stand-in
_RECORD_ENV = "TRTLLM_STANDIN_RECORD"
_record_lock = threading.Lock()


def _record(event: str, **fields: Any) -> None:
    path = os.environ.get(_RECORD_ENV)
    if not path:
        return
    with _record_lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, **fields}) + "\n")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """The fields of ``tensorrt_llm.SamplingParams`` this stand-in honours (same names,
    same defaults); constructing it with any other keyword raises ``TypeError``."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    best_of: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    exclude_input_from_output: bool = True
    ignore_eos: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (greedy is top_k=1); got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {self.max_tokens}")


@dataclass(slots=True)
class CompletionOutput:
    """``tensorrt_llm.executor.result.CompletionOutput`` (the fields the adapter reads)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[float] = field(default_factory=list)
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] | None = None
    stop_reason: int | str | None = None
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> list[float]:
        return self.logprobs[self._last_logprobs_len:]


_VLLM_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}


class RequestOutput:
    """``tensorrt_llm.llmapi.RequestOutput``: one request, iterated one step at a time."""

    def __init__(self, request_id: int, prompt_token_ids: list[int], engine: Any) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self._engine = engine
        self._queue: asyncio.Queue[tuple[list[int], list[float], str | None]] = asyncio.Queue()
        self._done = False
        self._aborted = False
        self._task: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Abort the generation request (as TensorRT-LLM's: returns at once; the stream then
        ends with finish_reason 'cancelled')."""
        _record("abort", request_id=self.request_id)
        self._aborted = True
        asyncio.get_running_loop().create_task(self._engine.abort(str(self.request_id)))

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        ids, lps, finish = await self._queue.get()
        out = self.outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        out.token_ids.extend(ids)
        out.logprobs.extend(lps)
        if finish is not None:
            out.finish_reason = _VLLM_FINISH.get(finish, "stop")  # type: ignore[assignment]
            self._done = True
        return self

    async def aresult(self) -> RequestOutput:
        while not self._done:
            await self.__anext__()
        return self


class LLM:
    """``tensorrt_llm.LLM`` over vLLM's CPU engine (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, model: str, tokenizer: str | None = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False,
                 tensor_parallel_size: int = 1, dtype: str = "auto", revision: str | None = None,
                 tokenizer_revision: str | None = None, **kwargs: Any) -> None:
        known = {"backend", "pipeline_parallel_size", "max_batch_size", "max_seq_len",
                 "max_num_tokens", "enable_chunked_prefill", "kv_cache_config",
                 "speculative_config", "enable_lora", "lora_config"}
        unknown = sorted(set(kwargs) - known)
        if unknown:  # LlmArgs forbids extra fields
            raise ValueError(f"Failed to parse the arguments for the LLM constructor: {unknown}")
        if kwargs.get("backend", "pytorch") != "pytorch":
            raise ValueError(f"this stand-in is the PyTorch backend; got backend {kwargs['backend']!r}")
        _record("llm", model=str(model), tensor_parallel_size=tensor_parallel_size,
                **{k: kwargs[k] for k in sorted(kwargs) if k != "lora_config"})
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kv = dict(kwargs.get("kv_cache_config") or {})
        args: dict[str, Any] = {
            "model": str(model), "tokenizer": tokenizer, "dtype": dtype, "enforce_eager": True,
            "enable_prefix_caching": bool(kv.get("enable_block_reuse", True)),
            "enable_chunked_prefill": bool(kwargs.get("enable_chunked_prefill", False)),
        }
        if kwargs.get("max_batch_size"):
            args["max_num_seqs"] = int(kwargs["max_batch_size"])
        if kwargs.get("max_seq_len"):
            args["max_model_len"] = int(kwargs["max_seq_len"])
        if kwargs.get("max_num_tokens"):
            args["max_num_batched_tokens"] = int(kwargs["max_num_tokens"])
        lora = dict(kwargs.get("lora_config") or {})
        if kwargs.get("enable_lora"):
            args.update(enable_lora=True, max_lora_rank=int(lora.get("max_lora_rank", 64)),
                        max_loras=int(lora.get("max_loras") or 1))
        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        self._tokenizer = self._engine.get_tokenizer()
        self._lora_paths: dict[int, tuple[str, str]] = {}

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def generate_async(self, inputs: Any, sampling_params: SamplingParams | None = None,
                       lora_request: Any = None, prompt_adapter_request: Any = None,
                       streaming: bool = False, queries: Any = None,
                       kv_cache_retention_config: Any = None, disaggregated_params: Any = None,
                       _postproc_params: Any = None) -> RequestOutput:
        from vllm import SamplingParams as VllmParams
        from vllm.lora.request import LoRARequest as VllmLora
        from vllm.sampling_params import RequestOutputKind

        sp = sampling_params or SamplingParams()
        if isinstance(inputs, dict) and "prompt_token_ids" in inputs:
            ids = [int(i) for i in inputs["prompt_token_ids"]]
        elif isinstance(inputs, list) and all(isinstance(i, int) for i in inputs):
            ids = list(inputs)
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        greedy = sp.top_k == 1 and sp.top_p in (None, 0.0)
        eos = getattr(self._tokenizer, "eos_token_id", None)
        stop_ids = list(sp.stop_token_ids or [])
        if sp.end_id is not None and sp.end_id != eos:
            stop_ids.append(sp.end_id)
        bad = [sp.bad] if isinstance(sp.bad, str) else sp.bad
        vp = VllmParams(
            n=1, max_tokens=sp.max_tokens, detokenize=False, output_kind=RequestOutputKind.DELTA,
            temperature=0.0 if greedy else (1.0 if sp.temperature is None else sp.temperature),
            top_k=0 if greedy or sp.top_k is None else sp.top_k,
            top_p=1.0 if greedy or sp.top_p is None else sp.top_p,
            min_p=sp.min_p or 0.0, seed=sp.seed, min_tokens=sp.min_tokens or 0,
            repetition_penalty=1.0 if sp.repetition_penalty is None else sp.repetition_penalty,
            presence_penalty=sp.presence_penalty or 0.0, frequency_penalty=sp.frequency_penalty or 0.0,
            stop_token_ids=stop_ids or None, bad_words=bad or None, ignore_eos=sp.ignore_eos,
            logprobs=0 if sp.logprobs else None,
        )
        vlora = None
        if lora_request is not None:
            vlora = VllmLora(lora_request.lora_name, lora_request.lora_int_id, lora_request.lora_path)
        rid = next(self._ids)
        result = RequestOutput(rid, ids, self._engine)
        _record("generate", request_id=rid, streaming=streaming, prompt_tokens=len(ids))

        async def run() -> None:
            try:
                async for out in self._engine.generate({"prompt_token_ids": ids}, vp,
                                                       request_id=str(rid), lora_request=vlora):
                    comp = out.outputs[0]
                    new = [int(t) for t in comp.token_ids]
                    lps = []
                    if sp.logprobs and comp.logprobs:
                        for tok, entry in zip(new, comp.logprobs):
                            lp = entry.get(tok) if entry else None
                            lps.append(float(lp.logprob) if lp is not None else 0.0)
                    result._queue.put_nowait((new, lps, comp.finish_reason))
                    if comp.finish_reason is not None:
                        return
                result._queue.put_nowait(([], [], "abort"))  # ended without a finish: aborted
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the engine ended the request otherwise
                result._queue.put_nowait(([], [], "abort"))

        result._task = asyncio.get_running_loop().create_task(run())
        return result

    def shutdown(self) -> None:
        _record("shutdown")
        with contextlib.suppress(Exception):
            self._engine.shutdown()
