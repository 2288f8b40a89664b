"""The vLLM adapter of the engine skeleton: vLLM's ``AsyncLLM`` (v1 engine).

``VLLM_SAMPLING`` is this engine's mapping line per sampling parameter: each engine input of
the request-parameter table that the skeleton passes on maps to a ``SamplingParams`` field
(or is listed with ``None`` where vLLM has nothing to set, with the reason). It is checked
against the table at import, so a new table row without its mapping line fails loudly.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from tritonforge.contract import GuideType
from tritonforge.triton_models.engine.request import SAMPLING_INPUTS, EngineRequest
from tritonforge.triton_models.engine.runner import (
    Delta,
    EngineCounts,
    SchedulerState,
    TokenizerAdapter,
)
from tritonforge.triton_models.errors import RequestError

__all__ = ["STRUCTURED_OUTPUTS_CONFIG", "VLLM_SAMPLING", "VllmAdapter", "structured_outputs"]

# engine input -> vLLM SamplingParams field; None: accepted, deliberately not passed.
VLLM_SAMPLING: Final[dict[str, str | None]] = {
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "min_p": "min_p",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "min_tokens": "min_tokens",
    "seed": "seed",
    "pad_id": None,  # no padding: one unpadded sequence per request
    "len_penalty": None,  # beam search only: preprocessing refuses other values for vLLM
    "beam_width": None,  # vLLM's engine does not beam-search: preprocessing allows only 1
}
if set(VLLM_SAMPLING) != SAMPLING_INPUTS:  # pragma: no cover - fails at import on drift
    raise ImportError(
        "tritonforge's vLLM adapter has no mapping line for "
        f"{sorted(SAMPLING_INPUTS - set(VLLM_SAMPLING))} (or a stale one for "
        f"{sorted(set(VLLM_SAMPLING) - SAMPLING_INPUTS)}): add it to VLLM_SAMPLING"
    )


# vLLM's StructuredOutputsConfig unless the spec's vllm.engine_args set one: xgrammar, the
# library preprocessing compiles every guide with (so what it accepts, the engine can build;
# vLLM's "auto" would fall back to another backend), and JSON generated compact (which
# vLLM allows with xgrammar or guidance only). With free whitespace (vLLM's default; in vLLM 0.32 the per-request
# ``disable_any_whitespace`` is not read by its xgrammar backend, only this engine setting), a
# small model sampling at temperature 1 was seen to spend its whole max_tokens on newlines and
# spaces inside the object: 2 to 4 of 20 SmolLM2 samples left unfinished.
STRUCTURED_OUTPUTS_CONFIG: Final[dict[str, Any]] = {"backend": "xgrammar", "disable_any_whitespace": True}


def structured_outputs(req: EngineRequest) -> Any:
    """vLLM's ``StructuredOutputsParams`` for the request's guide (``None`` without one);
    preprocessing has checked and compiled the guide.

    (JSON whitespace is the engine's setting: see ``STRUCTURED_OUTPUTS_CONFIG``.)
    """
    if not req.guide_type:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    kind = GuideType(req.guide_type)
    if kind is GuideType.JSON:
        return StructuredOutputsParams(json_object=True)
    if kind is GuideType.JSON_SCHEMA:
        return StructuredOutputsParams(json=json.loads(req.guide))
    if kind is GuideType.REGEX:
        return StructuredOutputsParams(regex=req.guide)
    if kind is GuideType.CHOICE:
        return StructuredOutputsParams(choice=list(json.loads(req.guide)))
    return StructuredOutputsParams(grammar=req.guide)


# How long EngineCore gets to exit on its own at shutdown before vLLM kills it.
ENGINE_SHUTDOWN_SECONDS = 2.0


class _SchedulerReport:
    """What vLLM's scheduler last reported (its stat loggers get ``SchedulerStats`` after
    every engine step, in the engine's output handler): the running/waiting/KV gauges, and
    running totals of vLLM's own per-step prefix-cache and speculative-decoding counts (the
    ones vLLM's Prometheus logger adds to ``vllm:prefix_cache_queries``/``_hits`` and
    ``vllm:spec_decode_num_drafts``/``_num_draft_tokens``/``_num_accepted_tokens``)."""

    __slots__ = ("at", "kv", "running", "totals", "waiting")

    def __init__(self) -> None:
        self.running, self.waiting, self.kv, self.at = 0, 0, 0.0, 0.0
        self.totals = EngineCounts()

    def logger_factory(self) -> Any:
        """vLLM's stat-logger factory that fills this report.

        It takes the place of vLLM's own Prometheus logger (vLLM adds that logger unless a
        factory given to it builds a ``PrometheusStatLogger``, so this one is a subclass that
        sets none of its metrics up). In the engine stub nobody could read vLLM's Prometheus
        registry -- tritonforge exports the engine's metrics through Triton -- yet it was
        filled after every engine step, on the loop that streams every token (py-spy of the
        default at one stream: ``PrometheusStatLogger.record`` in about a tenth of that
        loop's samples outside its waits on tritonserver)."""
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        report = self

        class _Logger(PrometheusStatLogger):
            def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
                self.engine_indexes = engine_indexes or [0]

            def record(self, scheduler_stats: Any, iteration_stats: Any,
                       mm_cache_stats: Any = None, engine_idx: int | None = 0) -> None:
                if scheduler_stats is not None:
                    report.record(scheduler_stats)

            def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
                pass

            def record_admission_rejection(self, reason: str) -> None:
                pass

            def log(self) -> None:
                pass

            def log_engine_initialized(self) -> None:
                pass

        return _Logger

    def record(self, scheduler_stats: Any) -> None:
        """Take in the scheduler's stats of one engine step."""
        self.running = int(scheduler_stats.num_running_reqs)
        self.waiting = int(scheduler_stats.num_waiting_reqs) + int(
            getattr(scheduler_stats, "num_skipped_waiting_reqs", 0) or 0)
        self.kv = float(scheduler_stats.kv_cache_usage)
        t = self.totals
        pc = getattr(scheduler_stats, "prefix_cache_stats", None)
        sd = getattr(scheduler_stats, "spec_decoding_stats", None)
        if pc is not None or sd is not None:
            self.totals = EngineCounts(
                t.prefix_cache_queries + int(getattr(pc, "queries", 0) or 0),
                t.prefix_cache_hits + int(getattr(pc, "hits", 0) or 0),
                t.spec_drafts + int(getattr(sd, "num_drafts", 0) or 0),
                t.spec_draft_tokens + int(getattr(sd, "num_draft_tokens", 0) or 0),
                t.spec_accepted_tokens + int(getattr(sd, "num_accepted_tokens", 0) or 0),
            )
        self.at = time.monotonic()


class VllmAdapter(TokenizerAdapter):
    """vLLM's AsyncLLM behind the engine skeleton."""

    def __init__(
        self,
        model_path: str,
        engine_args: Mapping[str, Any],
        *,
        lora_adapters: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.model_path = model_path
        self.engine_args = dict(engine_args)
        self.lora = {int(v["id"]): (name, str(v["path"])) for name, v in (lora_adapters or {}).items()}
        self.engine: Any = None
        self.tokenizer: Any = None
        self._kv_capacity = 0
        self._report = _SchedulerReport()

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        known = set(AsyncEngineArgs.__dataclass_fields__)
        unknown = sorted(set(self.engine_args) - known)
        if unknown:
            raise ValueError(f"unknown vLLM engine arguments: {', '.join(unknown)}")
        from vllm.config import StructuredOutputsConfig

        kwargs = dict(self.engine_args)
        so = kwargs.get("structured_outputs_config", STRUCTURED_OUTPUTS_CONFIG)
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**so) if isinstance(so, dict) else so
        args = AsyncEngineArgs(model=self.model_path, **kwargs)
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[self._report.logger_factory()])
        self.tokenizer = self.engine.get_tokenizer()
        if self.lora:
            from vllm.lora.request import LoRARequest

            # Load every adapter of the spec now: a broken one fails the model's load, not a
            # request later.
            for lora_id, (name, path) in sorted(self.lora.items()):
                try:
                    await self.engine.add_lora(LoRARequest(name, lora_id, path))
                except Exception as exc:
                    raise ValueError(f"LoRA adapter {name!r} ({path}): vLLM could not load it: "
                                     f"{exc}") from exc
        with contextlib.suppress(Exception):
            cc = self.engine.vllm_config.cache_config
            self._kv_capacity = int(cc.num_gpu_blocks or 0) * int(cc.block_size or 0)

    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv_capacity

    def scheduler_state(self) -> SchedulerState | None:
        """vLLM's scheduler counts after its last step (None before the first one)."""
        r = self._report
        if not r.at:
            return None
        return SchedulerState(r.running, r.waiting, r.kv, time.monotonic() - r.at)

    def engine_counts(self) -> EngineCounts:
        """vLLM's own prefix-cache and speculative-decoding totals since start."""
        return self._report.totals

    @property
    def max_num_seqs(self) -> int | None:
        """Sequences vLLM's scheduler runs at once (its resolved ``max_num_seqs``)."""
        with contextlib.suppress(Exception):
            return int(self.engine.vllm_config.scheduler_config.max_num_seqs)
        return None

    @property
    def dead(self) -> bool:
        """Whether vLLM's engine core has died (vLLM's own ``errored`` flag)."""
        return self.engine is not None and bool(getattr(self.engine, "errored", False))

    def sampling_params(self, req: EngineRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop_ids: list[int] = []
        if req.end_id is not None and req.end_id != self.eos_token_id:
            stop_ids.append(req.end_id)
        bad = [self.tokenizer.decode(w) for w in req.bad_words] if req.bad_words else None
        mapped = {field: req.sampling[name] for name, field in VLLM_SAMPLING.items()
                  if field is not None and name in req.sampling}
        return SamplingParams(
            n=req.n,
            max_tokens=req.max_tokens,
            stop_token_ids=stop_ids or None,
            bad_words=bad,
            logprobs=req.top_logprobs if req.return_log_probs else None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=structured_outputs(req),
            **mapped,
        )

    async def generate(self, req: EngineRequest, request_id: str) -> AsyncIterator[Delta]:
        try:
            params = self.sampling_params(req)
        except Exception as exc:  # vLLM's own validation of sampling values
            raise RequestError(str(exc)) from None
        lora_request = None
        if req.lora_task_id:
            if req.lora_task_id not in self.lora:
                raise RequestError(f"lora_task_id {req.lora_task_id} is not a configured adapter",
                                   param="lora_name")
            from vllm.lora.request import LoRARequest

            name, path = self.lora[req.lora_task_id]
            lora_request = LoRARequest(name, req.lora_task_id, path)
        stream = self.engine.generate(
            {"prompt_token_ids": req.input_ids}, params, request_id=request_id,
            lora_request=lora_request,
        )
        async for out in stream:
            for comp in out.outputs:  # with n > 1 (streamed as deltas): one sequence at a time
                yield self._delta(req, comp)

    @staticmethod
    def _delta(req: EngineRequest, comp: Any) -> Delta:
        """One ``CompletionOutput`` (a delta of sequence ``comp.index``) as the skeleton's."""
        new = [int(t) for t in comp.token_ids]
        lps: list[float] | None = None
        top: list[list[tuple[int, float]]] | None = None
        if req.return_log_probs and comp.logprobs:
            # vLLM's entry per token: {token id: Logprob(logprob, rank, ...)}, the sampled
            # token and the top_logprobs most likely ones (ranks 1..k)
            lps, top = [], []
            for tok, entry in zip(new, comp.logprobs):
                lp = entry.get(tok) if entry else None
                lps.append(float(lp.logprob) if lp is not None else 0.0)
                ranked = sorted((v.rank, int(t), float(v.logprob)) for t, v in (entry or {}).items()
                                if v.rank is not None and v.rank <= req.top_logprobs)
                top.append([(t, lp_) for _, t, lp_ in ranked])
        return Delta(new, lps, comp.finish_reason, top if req.top_logprobs else None, int(comp.index))

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def shutdown(self) -> None:
        if self.engine is not None:
            # vLLM's default waits 5 s for EngineCore to exit on SIGTERM; measured under load
            # it used all 5 (then force-killed it) -- Triton's whole exit timeout, so the server
            # exited 1. Requests are already ended here (drain); give it ENGINE_SHUTDOWN_SECONDS.
            self.engine.shutdown(timeout=ENGINE_SHUTDOWN_SECONDS)
            self.engine = None
