"""The TensorRT-LLM LLM-API adapter of the engine skeleton: ``tensorrt_llm.LLM`` (PyTorch
backend) through its async streaming API.

The skeleton (:mod:`.runner`) does the request lifecycle -- stop words on ids, end_id,
streaming on character boundaries, cancellation, draining, metrics -- exactly as for vLLM;
this adapter only maps an :class:`EngineRequest` to TensorRT-LLM's ``SamplingParams`` and
its streamed ``RequestOutput``s back to token deltas. In-flight batching happens inside
TensorRT-LLM's executor; every Triton request is one ``LLM.generate_async(...,
streaming=True)`` call, aborted with the result's ``abort()``.

The API used, as TensorRT-LLM's source defines it (``tensorrt_llm/llmapi/llm.py``,
``tensorrt_llm/executor/result.py``, ``tensorrt_llm/sampling_params.py``,
``tensorrt_llm/executor/request.py``): ``LLM(**model.yaml)``, ``LLM.tokenizer``,
``LLM.generate_async(inputs, sampling_params=, lora_request=, streaming=True)`` returning a
``RequestOutput`` that is async-iterable (one step per ``__anext__``) with ``.finished``,
``.abort()``, ``.outputs[0].token_ids_diff`` / ``.logprobs_diff`` / ``.finish_reason``
(``'stop' | 'length' | 'timeout' | 'cancelled'``); ``SamplingParams`` keyword-only fields;
``LoRARequest(lora_name, lora_int_id, lora_path)``; ``LLM.shutdown()``.

``LLMAPI_SAMPLING`` is this engine's mapping line per sampling parameter (checked against the
request-parameter table at import, like ``VLLM_SAMPLING``). Greedy decoding: TensorRT-LLM
wants ``temperature > 0``, and decodes greedily with ``top_k = 1``; a request with
``temperature == 0`` is sent as ``top_k = 1`` with no temperature and no top_p.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from tritonforge.triton_models.engine.request import SAMPLING_INPUTS, EngineRequest
from tritonforge.triton_models.engine.runner import Delta, TokenizerAdapter
from tritonforge.triton_models.errors import RequestError

__all__ = ["LLMAPI_FINISH", "LLMAPI_SAMPLING", "LlmApiAdapter"]

# engine input -> tensorrt_llm.SamplingParams field; None: accepted, deliberately not passed.
LLMAPI_SAMPLING: Final[dict[str, str | None]] = {
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "min_p": "min_p",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "min_tokens": "min_tokens",
    "seed": "seed",
    "pad_id": "pad_id",
    "len_penalty": None,  # beam search only: preprocessing refuses other values here
    "beam_width": None,  # no beam search through this engine model: preprocessing allows only 1
}
if set(LLMAPI_SAMPLING) != SAMPLING_INPUTS:  # pragma: no cover - fails at import on drift
    raise ImportError(
        "tritonforge's TensorRT-LLM LLM-API adapter has no mapping line for "
        f"{sorted(SAMPLING_INPUTS - set(LLMAPI_SAMPLING))} (or a stale one for "
        f"{sorted(set(LLMAPI_SAMPLING) - SAMPLING_INPUTS)}): add it to LLMAPI_SAMPLING"
    )

# CompletionOutput.finish_reason -> the skeleton's Delta.finish
LLMAPI_FINISH: Final[dict[str, str]] = {
    "stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort",
}


def _logprob(entry: Any, token: int) -> float:
    """One token's log-probability from a ``logprobs_diff`` entry: a float, or a
    ``{token: Logprob}`` mapping (top-k logprobs)."""
    if isinstance(entry, (int, float)):
        return float(entry)
    if isinstance(entry, Mapping):
        lp = entry.get(token)
        return float(getattr(lp, "logprob", lp)) if lp is not None else 0.0
    return 0.0


class LlmApiAdapter(TokenizerAdapter):
    """``tensorrt_llm.LLM`` behind the engine skeleton."""

    def __init__(self, llm_args: Mapping[str, Any], *,
                 lora_adapters: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.llm_args = dict(llm_args)
        self.lora = {int(v["id"]): (name, str(v["path"])) for name, v in (lora_adapters or {}).items()}
        self.llm: Any = None
        self.tokenizer: Any = None
        self._results: dict[str, Any] = {}  # engine request id -> its live RequestOutput

    async def start(self) -> None:
        from tensorrt_llm import LLM

        self.llm = LLM(**self.llm_args)
        self.tokenizer = self.llm.tokenizer

    @property
    def kv_capacity_tokens(self) -> int:
        return 0  # not reported by the LLM API; the skeleton's gauges use its own counts

    def sampling_params(self, req: EngineRequest) -> Any:
        from tensorrt_llm import SamplingParams

        mapped = {field: req.sampling[name] for name, field in LLMAPI_SAMPLING.items()
                  if field is not None and name in req.sampling}
        if mapped.get("temperature") == 0:  # greedy: top_k 1 (TensorRT-LLM wants temperature > 0)
            mapped.pop("temperature")
            mapped.pop("top_p", None)
            mapped["top_k"] = 1
        elif mapped.get("top_k") == 0:
            mapped.pop("top_k")  # 0: no top-k (the runtime's default)
        bad = [self.tokenizer.decode(w) for w in req.bad_words] if req.bad_words else None
        return SamplingParams(
            max_tokens=req.max_tokens,
            end_id=req.end_id,
            bad=bad,
            logprobs=1 if req.return_log_probs else None,
            detokenize=False,
            exclude_input_from_output=True,  # the skeleton echoes the prompt itself
            **mapped,
        )

    async def generate(self, req: EngineRequest, request_id: str) -> AsyncIterator[Delta]:
        try:
            params = self.sampling_params(req)
        except (TypeError, ValueError) as exc:  # TensorRT-LLM's own validation of sampling values
            raise RequestError(str(exc)) from None
        lora_request = None
        if req.lora_task_id:
            if req.lora_task_id not in self.lora:
                raise RequestError(f"lora_task_id {req.lora_task_id} is not a configured adapter",
                                   param="lora_name")
            from tensorrt_llm.executor.request import LoRARequest

            name, path = self.lora[req.lora_task_id]
            lora_request = LoRARequest(name, req.lora_task_id, path)
        result = self.llm.generate_async({"prompt_token_ids": list(req.input_ids)},
                                         sampling_params=params, lora_request=lora_request,
                                         streaming=True)
        self._results[request_id] = result
        try:
            async for out in result:
                comp = out.outputs[0]
                new = [int(t) for t in comp.token_ids_diff]
                lps: list[float] | None = None
                if req.return_log_probs:
                    diff = list(comp.logprobs_diff or ())
                    lps = [_logprob(e, t) for e, t in zip(diff, new)] + [0.0] * max(0, len(new) - len(diff))
                finish = LLMAPI_FINISH.get(str(comp.finish_reason), "stop") if out.finished else None
                yield Delta(new, lps, finish)
        finally:
            self._results.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None and not result.finished:
            result.abort()

    def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
