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
``.abort()`` and ``.outputs`` (``CompletionOutput`` per sequence: ``.index``, ``.token_ids``,
``.logprobs`` -- per token a ``{token id: Logprob(logprob, rank)}`` of the ``logprobs`` most
likely tokens, or a float in older releases -- and ``.finish_reason`` in ``'stop' | 'length'
| 'timeout' | 'cancelled'``); ``SamplingParams`` keyword-only fields, among them ``n``,
``logprobs`` and ``guided_decoding`` (a ``GuidedDecodingParams`` with one of ``json``,
``regex``, ``grammar``, ``json_object``), the last needing ``LLM(guided_decoding_backend=
"xgrammar")`` (the generator writes it into ``model.yaml``);
``LoRARequest(lora_name, lora_int_id, lora_path)``; ``LLM.shutdown()``.

Several sequences (``n``): each step of the result updates one sequence, and
``GenerationResult._handle_sequence`` moves only that sequence's ``token_ids_diff`` mark, so
this adapter counts what it has taken of each sequence itself; a sequence's finish reason is
set only when the whole request is done (``is_final``), so every sequence's last delta comes
with the request's last step.

``LLMAPI_SAMPLING`` is this engine's mapping line per sampling parameter (checked against the
request-parameter table at import, like ``VLLM_SAMPLING``). Greedy decoding: TensorRT-LLM
wants ``temperature > 0``, and decodes greedily with ``top_k = 1``; a request with
``temperature == 0`` is sent as ``top_k = 1`` with no temperature and no top_p.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from tritonforge.contract import GUIDE_TYPE_INPUT, TRTLLM_GUIDE_TYPES, GuideType
from tritonforge.triton_models.engine.request import SAMPLING_INPUTS, EngineRequest
from tritonforge.triton_models.engine.runner import Delta, TokenizerAdapter
from tritonforge.triton_models.errors import RequestError

__all__ = ["LLMAPI_FINISH", "LLMAPI_GUIDES", "LLMAPI_SAMPLING", "LlmApiAdapter", "guided_decoding"]

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

# The engine contract's guide type -> GuidedDecodingParams field (tensorrt_llm/sampling_params.py).
LLMAPI_GUIDES: Final[dict[GuideType, str]] = {
    GuideType.JSON: "json_object",
    GuideType.JSON_SCHEMA: "json",
    GuideType.REGEX: "regex",
    GuideType.EBNF_GRAMMAR: "grammar",
}
if set(LLMAPI_GUIDES) != set(TRTLLM_GUIDE_TYPES):  # pragma: no cover - fails at import on drift
    raise ImportError("LLMAPI_GUIDES must map exactly TensorRT-LLM's guide types")

# CompletionOutput.finish_reason -> the skeleton's Delta.finish
LLMAPI_FINISH: Final[dict[str, str]] = {
    "stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort",
}


def _logprob(entry: Any, token: int) -> float:
    """One token's log-probability from a ``logprobs`` entry: a float, or a
    ``{token: Logprob}`` mapping (top-k logprobs); 0 for none."""
    if isinstance(entry, (int, float)):
        return float(entry)
    if isinstance(entry, Mapping):
        lp = entry.get(token)
        return float(getattr(lp, "logprob", lp)) if lp is not None else 0.0
    return 0.0


def _top(entry: Any, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of a position, most likely first, from a ``logprobs``
    entry ``{token: Logprob(logprob, rank)}`` (those of rank 1..k where ranks are given, else
    the k highest); none from an entry that is a bare float (older releases)."""
    if not isinstance(entry, Mapping):
        return []
    items: list[tuple[int, float, int | None]] = []
    for t, v in entry.items():
        lp: Any = getattr(v, "logprob", v)
        items.append((int(t), float(lp), getattr(v, "rank", None)))
    ranked = [(r, t, lp) for t, lp, r in items if r is not None]
    if len(ranked) == len(items):
        return [(t, lp) for r, t, lp in sorted(ranked) if r <= k]
    return [(t, lp) for t, lp, _ in sorted(items, key=lambda i: -i[1])[:k]]


def guided_decoding(req: EngineRequest) -> Any:
    """TensorRT-LLM's ``GuidedDecodingParams`` for the request's guide (``None`` without
    one); preprocessing has checked it and sends TensorRT-LLM's guide types only."""
    if not req.guide_type:
        return None
    from tensorrt_llm.sampling_params import GuidedDecodingParams

    field = LLMAPI_GUIDES.get(GuideType(req.guide_type))
    if field is None:
        raise RequestError(f"{GUIDE_TYPE_INPUT} {req.guide_type!r} is not one TensorRT-LLM takes "
                           f"({', '.join(t.value for t in TRTLLM_GUIDE_TYPES)})", param=GUIDE_TYPE_INPUT)
    return GuidedDecodingParams(**{field: True if field == "json_object" else req.guide})


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
            n=req.n,
            logprobs=max(1, req.top_logprobs) if req.return_log_probs else None,
            guided_decoding=guided_decoding(req),
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
        taken: dict[int, int] = {}  # tokens of each sequence already passed on
        ended: set[int] = set()
        try:
            async for out in result:
                for comp in out.outputs:
                    index = int(comp.index)
                    if index in ended:
                        continue
                    start = taken.get(index, 0)
                    new = [int(t) for t in (comp.token_ids or ())[start:]]
                    taken[index] = start + len(new)
                    finish = self._finish(req, comp, new, taken[index], out.finished)
                    if not new and finish is None:
                        continue  # not this step's sequence
                    if finish is not None:
                        ended.add(index)
                    lps: list[float] | None = None
                    top: list[list[tuple[int, float]]] | None = None
                    if req.return_log_probs:
                        entries = list(comp.logprobs or ())[start:start + len(new)]
                        entries += [None] * (len(new) - len(entries))
                        lps = [_logprob(e, t) for e, t in zip(entries, new)]
                        if req.top_logprobs:
                            top = [_top(e, req.top_logprobs) for e in entries]
                    yield Delta(new, lps, finish, top, index)
        finally:
            self._results.pop(request_id, None)

    def _finish(self, req: EngineRequest, comp: Any, new: list[int], generated: int,
                request_done: bool) -> str | None:
        """Whether (and why) a sequence has ended with this step. With several sequences the
        LLM API names a sequence's finish reason only once the whole request is done, so a
        sequence that ends earlier is seen ending here: at end_id (which ends a sequence) or
        at max_tokens."""
        if new and new[-1] in {t for t in (req.end_id, self.eos_token_id) if t is not None}:
            return "stop"
        if generated >= req.max_tokens:
            return "length"
        if not request_done:
            return None
        reason = comp.finish_reason
        return LLMAPI_FINISH.get(str(reason), "stop") if reason else "stop"

    async def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None and not result.finished:
            result.abort()

    def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
