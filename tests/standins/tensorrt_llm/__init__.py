"""A STAND-IN for TensorRT-LLM's LLM API, for tests on machines without a GPU.

This is not TensorRT-LLM. It exposes exactly the part of ``tensorrt_llm``'s public API that
tritonforge's LLM-API engine adapter (``tritonforge.triton_models.engine.trtllm_llmapi``)
uses, with the names and signatures of TensorRT-LLM's own source (NVIDIA/TensorRT-LLM):

* ``tensorrt_llm/llmapi/llm.py`` -- ``LLM.__init__``, ``LLM.generate_async``,
  ``LLM.tokenizer``, ``LLM.shutdown``;
* ``tensorrt_llm/llmapi/llm_args.py`` -- the ``LLM()`` arguments below, among them
  ``guided_decoding_backend`` (``"xgrammar" | "llguidance"``, default ``None``);
* ``tensorrt_llm/executor/result.py`` -- the result (``GenerationResult``, what
  ``generate_async`` returns): async iteration one step at a time, ``finished``, ``abort()``,
  ``aborted()``, ``outputs`` (one ``CompletionOutput`` per sequence, in ``executor/result``
  here) and its per-sequence updates: each step handles ONE sequence (the executor's
  response for ``sequence_index``) and moves only that sequence's diff marks; finish reasons
  (``'stop' | 'length' | 'timeout' | 'cancelled'``) are set on the step that ends the whole
  request (``is_final``), for the sequence that step handles (``_handle_sequence``), and a
  cancelled request marks every sequence ``'cancelled'``;
* ``tensorrt_llm/sampling_params.py`` -- ``SamplingParams`` and ``GuidedDecodingParams``
  (``sampling_params`` here);
* ``tensorrt_llm/executor/request.py`` -- ``LoRARequest``.

Underneath, REAL tokens come from the real vLLM CPU engine (``vllm.v1.engine.async_llm.
AsyncLLM``), so a test serves real text through the adapter on the real tritonserver.

What it translates: ``LLM()`` arguments to vLLM engine arguments (``max_batch_size`` ->
``max_num_seqs``, ``max_seq_len`` -> ``max_model_len``, ``kv_cache_config.enable_block_reuse``
-> ``enable_prefix_caching``, LoRA limits, ``guided_decoding_backend`` -> vLLM's structured
outputs on that backend with free JSON whitespace, as TensorRT-LLM's xgrammar matcher
compiles JSON schemas (``_torch/pyexecutor/grammar_matcher.py``); always eager on CPU),
TensorRT-LLM's greedy (``top_k == 1``) to vLLM's (``temperature == 0``), ``end_id`` to a stop
token, ``n`` / ``logprobs`` / ``guided_decoding`` to vLLM's ``n`` / ``logprobs`` /
``structured_outputs``. Arguments TensorRT-LLM has and vLLM cannot honour (TP/PP across
GPUs, speculative configs) are accepted and recorded, not run. A guide sent to an ``LLM``
made without ``guided_decoding_backend`` is refused (the stand-in's choice: a missing
setting must show, not generate unguided).

Its own record: with ``$TRTLLM_STANDIN_RECORD`` set, every ``LLM()``, ``generate_async`` and
``abort()`` appends a JSON line there (``{"event": "abort", "pid": ..., "request_id": ...}``),
the "engine side" a test reads to see that a cancellation reached the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
from typing import Any

from .executor.result import CompletionOutput, Logprob
from .sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "STANDIN", "GuidedDecodingParams", "RequestOutput", "SamplingParams"]

STANDIN = True  # what makes this package recognisable as the stand-in
_RECORD_ENV = "TRTLLM_STANDIN_RECORD"
_record_lock = threading.Lock()
GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")


def _record(event: str, **fields: Any) -> None:
    path = os.environ.get(_RECORD_ENV)
    if not path:
        return
    with _record_lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


_VLLM_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}
_ENDED = -1  # queue item index: the engine's stream ended (aborted) for every sequence left


class RequestOutput:
    """``tensorrt_llm.llmapi.RequestOutput`` (upstream's ``GenerationResult``): one request,
    iterated one step -- one sequence's update -- at a time."""

    def __init__(self, request_id: int, prompt_token_ids: list[int], engine: Any, n: int) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self._outputs = [CompletionOutput(i) for i in range(n)]
        self._engine = engine
        self._queue: asyncio.Queue[tuple[int, list[int], list[dict[int, Logprob]], str | None]] = asyncio.Queue()
        self._ended: dict[int, str] = {}  # sequence -> vLLM's finish reason
        self._done = False
        self._aborted = False
        self._task: asyncio.Task[None] | None = None

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs

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
        index, ids, lps, finish = await self._queue.get()
        if index == _ENDED:  # every sequence still running is cancelled
            for out in self._outputs:
                if out.index not in self._ended:
                    out._last_token_ids_len, out._last_logprobs_len = len(out.token_ids), len(out.logprobs)
                    out.finish_reason = "cancelled"
            self._done = True
            return self
        out = self._outputs[index]
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        out.token_ids.extend(ids)
        out.logprobs.extend(lps)
        if finish is not None:
            self._ended[index] = finish
            if finish == "abort":
                for o in self._outputs:
                    o.finish_reason = "cancelled"
        self._done = len(self._ended) == len(self._outputs)
        if self._done and out.finish_reason is None:  # only the step that ends the request
            out.finish_reason = _VLLM_FINISH.get(self._ended[index], "stop")  # type: ignore[assignment]
        return self

    async def aresult(self) -> RequestOutput:
        while not self._done:
            await self.__anext__()
        return self


def _structured_outputs(guide: GuidedDecodingParams | None) -> Any:
    """vLLM's ``StructuredOutputsParams`` for a ``GuidedDecodingParams``."""
    if guide is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if guide.json is not None:
        return StructuredOutputsParams(json=json.loads(guide.json) if isinstance(guide.json, str) else guide.json)
    if guide.regex is not None:
        return StructuredOutputsParams(regex=guide.regex)
    if guide.grammar is not None:
        return StructuredOutputsParams(grammar=guide.grammar)
    if guide.structural_tag is not None:
        return StructuredOutputsParams(structural_tag=guide.structural_tag)
    if guide.json_object:
        return StructuredOutputsParams(json_object=True)
    return None


def _logprob_results(comp: Any, new: list[int], k: int) -> list[dict[int, Logprob]]:
    """vLLM's logprobs of the tokens ``new`` as TensorRT-LLM's ``LogprobResults``: per
    token, the ``k`` most likely tokens and the sampled one, ``{token: Logprob(lp, rank)}``."""
    out: list[dict[int, Logprob]] = []
    for tok, entry in zip(new, comp.logprobs or ()):
        out.append({int(t): Logprob(float(v.logprob), v.rank) for t, v in (entry or {}).items()
                    if t == tok or (v.rank is not None and v.rank <= k)})
    return out


class LLM:
    """``tensorrt_llm.LLM`` over vLLM's CPU engine (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, model: str, tokenizer: str | None = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False,
                 tensor_parallel_size: int = 1, dtype: str = "auto", revision: str | None = None,
                 tokenizer_revision: str | None = None, **kwargs: Any) -> None:
        known = {"backend", "pipeline_parallel_size", "max_batch_size", "max_seq_len",
                 "max_num_tokens", "enable_chunked_prefill", "kv_cache_config",
                 "speculative_config", "enable_lora", "lora_config", "guided_decoding_backend"}
        unknown = sorted(set(kwargs) - known)
        if unknown:  # LlmArgs forbids extra fields
            raise ValueError(f"Failed to parse the arguments for the LLM constructor: {unknown}")
        if kwargs.get("backend", "pytorch") != "pytorch":
            raise ValueError(f"this stand-in is the PyTorch backend; got backend {kwargs['backend']!r}")
        self.guided_decoding_backend = kwargs.get("guided_decoding_backend")
        if self.guided_decoding_backend not in (None, *GUIDED_DECODING_BACKENDS):
            raise ValueError(f"guided_decoding_backend must be one of {GUIDED_DECODING_BACKENDS}; "
                             f"got {self.guided_decoding_backend!r}")
        _record("llm", model=str(model), tensor_parallel_size=tensor_parallel_size,
                **{k: kwargs[k] for k in sorted(kwargs) if k != "lora_config"})
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        kv = dict(kwargs.get("kv_cache_config") or {})
        args: dict[str, Any] = {
            "model": str(model), "tokenizer": tokenizer, "dtype": dtype, "enforce_eager": True,
            "enable_prefix_caching": bool(kv.get("enable_block_reuse", True)),
            "enable_chunked_prefill": bool(kwargs.get("enable_chunked_prefill", False)),
        }
        if self.guided_decoding_backend is not None:
            args["structured_outputs_config"] = StructuredOutputsConfig(
                backend=self.guided_decoding_backend, disable_any_whitespace=False)
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
        if sp.guided_decoding is not None and self.guided_decoding_backend is None:
            raise ValueError("stand-in: a guided_decoding request to an LLM made without "
                             "guided_decoding_backend")
        greedy = sp.top_k == 1 and sp.top_p in (None, 0.0)
        eos = getattr(self._tokenizer, "eos_token_id", None)
        stop_ids = list(sp.stop_token_ids or [])
        if sp.end_id is not None and sp.end_id != eos:
            stop_ids.append(sp.end_id)
        bad = [sp.bad] if isinstance(sp.bad, str) else sp.bad
        vp = VllmParams(
            n=sp.n, max_tokens=sp.max_tokens, detokenize=False, output_kind=RequestOutputKind.DELTA,
            temperature=0.0 if greedy else (1.0 if sp.temperature is None else sp.temperature),
            top_k=0 if greedy or sp.top_k is None else sp.top_k,
            top_p=1.0 if greedy or sp.top_p is None else sp.top_p,
            min_p=sp.min_p or 0.0, seed=sp.seed, min_tokens=sp.min_tokens or 0,
            repetition_penalty=1.0 if sp.repetition_penalty is None else sp.repetition_penalty,
            presence_penalty=sp.presence_penalty or 0.0, frequency_penalty=sp.frequency_penalty or 0.0,
            stop_token_ids=stop_ids or None, bad_words=bad or None, ignore_eos=sp.ignore_eos,
            logprobs=sp.logprobs, structured_outputs=_structured_outputs(sp.guided_decoding),
        )
        vlora = None
        if lora_request is not None:
            vlora = VllmLora(lora_request.lora_name, lora_request.lora_int_id, lora_request.lora_path)
        rid = next(self._ids)
        result = RequestOutput(rid, ids, self._engine, sp.n)
        _record("generate", request_id=rid, streaming=streaming, prompt_tokens=len(ids), n=sp.n,
                logprobs=sp.logprobs, guided=sp.guided_decoding is not None)

        async def run() -> None:
            ended: set[int] = set()
            try:
                async for out in self._engine.generate({"prompt_token_ids": ids}, vp,
                                                       request_id=str(rid), lora_request=vlora):
                    for comp in out.outputs:  # one sequence per queue item, as the executor's responses
                        new = [int(t) for t in comp.token_ids]
                        lps = _logprob_results(comp, new, sp.logprobs or 0) if sp.logprobs else []
                        result._queue.put_nowait((int(comp.index), new, lps, comp.finish_reason))
                        if comp.finish_reason is not None:
                            ended.add(int(comp.index))
                    if len(ended) == sp.n:
                        return
                result._queue.put_nowait((_ENDED, [], [], "abort"))  # ended without a finish: aborted
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the engine ended the request otherwise
                result._queue.put_nowait((_ENDED, [], [], "abort"))

        result._task = asyncio.get_running_loop().create_task(run())
        return result

    def shutdown(self) -> None:
        _record("shutdown")
        with contextlib.suppress(Exception):
            self._engine.shutdown()
