"""The pydantic v2 schema of a deployment spec.

Every field has a docstring (the single source for ``docs/generator.md``) and a default, so
a minimal spec is a handful of lines. Types and ranges are checked here; rules that relate
fields to each other (backend x quantization, streaming x instances, ...) live in
``tritonforge.spec.rules`` so they are all in one place.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from tritonforge.contract import LIMITS, REQUEST_PARAMETERS, DType, EngineKind
from tritonforge.spec.names import name_problem

__all__ = [
    "PACKAGED_MODEL",
    "Backend",
    "Batching",
    "BatchingStrategy",
    "Device",
    "EngineModel",
    "Instances",
    "KvCache",
    "KvCacheDtype",
    "Limits",
    "Lora",
    "ModelDtype",
    "ModelSection",
    "Parallelism",
    "Quantization",
    "SamplingSection",
    "SchedulerPolicy",
    "Spec",
    "Speculative",
    "SpeculativeMethod",
    "TensorRTLLMSection",
    "VllmSection",
]

Backend = Literal["vllm", "tensorrtllm"]
Device = Literal["auto", "cpu", "gpu"]
BatchingStrategy = Literal["inflight_fused_batching", "inflight_batching", "V1"]
SchedulerPolicy = Literal["max_utilization", "guaranteed_no_evict"]
Quantization = Literal["none", "fp8", "int8", "int4_awq", "awq", "gptq", "gguf"]
KvCacheDtype = Literal["auto", "fp8", "int8"]
ModelDtype = Literal["auto", "float16", "bfloat16", "float32"]
SpeculativeMethod = Literal["none", "draft_model", "ngram", "eagle", "medusa", "lookahead"]
EngineModel = Literal["tritonforge", "stock"]
ChatTemplate = Literal["messages", "always"]

PACKAGED_MODEL = "package:smollm2-135m-instruct"


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, use_attribute_docstrings=True, validate_default=True
    )


class ModelSection(_Section):
    """Which model to serve and how to tokenize it."""

    path: str = Field(default=PACKAGED_MODEL, min_length=1)
    """Model reference: ``package:smollm2-135m-instruct`` (the packaged default model), a
    Hugging Face model folder, or a ``.gguf`` file (with ``quantization: gguf``)."""

    tokenizer: str | None = Field(default=None, min_length=1)
    """Tokenizer folder or reference; defaults to ``model.path``."""

    chat_template: ChatTemplate = "messages"
    """``messages``: apply the model's chat template to the ``messages`` input only;
    ``always``: also wrap a plain ``text_input`` as one user message."""

    max_model_len: int = Field(default=4096, ge=16, le=1_048_576)
    """Context length in tokens (prompt + generated)."""

    skip_special_tokens: bool = True
    """Drop special tokens (EOS, chat markers) from the generated text."""

    dtype: ModelDtype = "auto"
    """Weight/activation dtype: ``auto`` (the checkpoint's), ``float16``, ``bfloat16``,
    ``float32``."""


class Batching(_Section):
    """Batching and scheduling of the engine."""

    max_batch_size: int = Field(default=64, ge=1, le=4096)
    """``max_batch_size`` of every model in the repository (and of a TensorRT-LLM engine
    build)."""

    strategy: BatchingStrategy = "inflight_fused_batching"
    """TensorRT-LLM only: ``gpt_model_type``/batching strategy."""

    scheduler_policy: SchedulerPolicy = "guaranteed_no_evict"
    """TensorRT-LLM only: ``batch_scheduler_policy``."""

    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=10_000_000)
    """Dynamic-batching queue delay of the TensorRT-LLM engine model (refused for
    tritonforge's vLLM engine model, which has no batcher: vLLM schedules every step)."""

    max_queue_size: int | None = Field(default=None, ge=1, le=1_000_000)
    """Engine queue bound: requests beyond it are rejected at once as OVERLOADED ("queue
    full"; gRPC status UNAVAILABLE; unset: unbounded). TensorRT-LLM: Triton's queue policy; vLLM
    engine model: requests waiting beyond the `max_num_seqs` running ones."""

    max_num_seqs: int | None = Field(default=None, ge=1, le=65_536)
    """vLLM only: sequences scheduled concurrently (default: ``max_batch_size``)."""

    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    """Tokens per engine step (vLLM ``max_num_batched_tokens``, TensorRT-LLM build
    ``--max_num_tokens``)."""

    chunked_prefill: bool = False
    """Split long prompts into chunks (vLLM ``enable_chunked_prefill``, TensorRT-LLM
    ``enable_chunked_context``)."""

    stream_interval_ms: int = Field(default=0, ge=0, le=10_000)
    """tritonforge's engine model (vLLM, TensorRT-LLM LLM API): once
    ``coalesce_from_streams`` requests are live, a stream's new tokens go out at most every this
    many milliseconds, several to a response (its first and its last response never wait); with
    more live requests the interval stretches in proportion (twice as many streams, twice the
    interval, at most 4 times it), so the responses per second stay about the same; 0: every
    token as it is generated. Each response crosses the engine stub, tritonserver and
    postprocessing, so under load fewer, fuller responses leave more CPU to the engine."""

    coalesce_from_streams: int = Field(default=8, ge=1, le=1_000_000)
    """Live requests from which ``stream_interval_ms`` applies (below it, every token goes out
    as generated)."""


class KvCache(_Section):
    """The KV cache."""

    gpu_memory_fraction: float = Field(default=0.9, gt=0.0, le=1.0)
    """GPU memory fraction: vLLM ``gpu_memory_utilization`` (of all memory), TensorRT-LLM
    ``kv_cache_free_gpu_mem_fraction`` (of memory free after loading weights)."""

    max_tokens: int | None = Field(default=None, ge=1)
    """TensorRT-LLM only: ``max_tokens_in_paged_kv_cache``."""

    prefix_caching: bool = False
    """Reuse KV blocks of shared prompt prefixes (``enable_prefix_caching`` /
    ``enable_kv_cache_reuse``)."""

    sliding_window: int | None = Field(default=None, ge=1)
    """TensorRT-LLM only: ``max_attention_window_size`` in tokens."""

    sink_tokens: int | None = Field(default=None, ge=0)
    """TensorRT-LLM only: ``sink_token_length``."""

    dtype: KvCacheDtype = "auto"
    """KV cache dtype: ``auto``, ``fp8`` (both backends), ``int8`` (TensorRT-LLM)."""

    host_offload_bytes: int | None = Field(default=None, ge=0)
    """TensorRT-LLM only: ``kv_cache_host_memory_bytes`` (host memory for offloaded
    blocks)."""

    cpu_space_gib: float | None = Field(default=None, gt=0.0, le=4096.0)
    """vLLM on CPU: KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``; unset: 4)."""


class Parallelism(_Section):
    """Model parallelism."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel degree."""

    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    """Pipeline-parallel degree."""

    gpu_device_ids: list[int] | None = None
    """GPUs to use, one per rank (``tensor_parallel_size * pipeline_parallel_size``)."""

    nodes: int = Field(default=1, ge=1, le=64)
    """Pods (machines) one engine replica spans; each gets ``tensor_parallel_size *
    pipeline_parallel_size / nodes`` GPUs. Above 1, ``generate --k8s`` emits a
    LeaderWorkerSet (TensorRT-LLM: MPI leader/workers; vLLM: Ray head/workers)."""


class Speculative(_Section):
    """Speculative decoding."""

    method: SpeculativeMethod = "none"
    """``none``; vLLM: ``draft_model``, ``ngram``, ``eagle``, ``medusa``; TensorRT-LLM:
    ``medusa``, ``eagle``, ``lookahead``."""

    draft_model: str | None = Field(default=None, min_length=1)
    """Draft model / speculative heads folder (``draft_model``, ``eagle``, ``medusa``)."""

    num_speculative_tokens: int = Field(default=4, ge=1, le=64)
    """Tokens proposed per step (TensorRT-LLM: ``--max_draft_len``)."""


class Lora(_Section):
    """LoRA adapters."""

    enabled: bool = False
    """Serve LoRA adapters (requests pick one with the ``lora_name`` input)."""

    max_adapters: int = Field(default=4, ge=1, le=1024)
    """Adapters resident at once (vLLM ``max_loras``)."""

    max_rank: int = Field(default=16, ge=1, le=512)
    """Largest adapter rank (vLLM ``max_lora_rank``, TensorRT-LLM ``--max_lora_rank``)."""

    adapters: dict[str, str] = Field(default_factory=dict)
    """Adapters by name: ``{name: folder}``. Ids are assigned 1.. in name order."""

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in sorted(value):
            if (msg := name_problem(name, "an adapter name")) is not None:
                raise ValueError(msg)
        return value


class Instances(_Section):
    """Instances and batching of the Python pre/post-processing models."""

    preprocessing: int = Field(default=1, ge=1, le=256)
    """Preprocessing (tokenizer) instances."""

    postprocessing: int = Field(default=1, ge=1, le=256)
    """Postprocessing (detokenizer) instances; must be 1 when streaming (it keeps each
    stream's incremental detokenizer state in memory)."""

    bls: int = Field(default=0, ge=0, le=256)
    """Instances of the optional BLS model ``tensorrt_llm_bls``; 0 leaves it out."""

    sync: int = Field(default=2, ge=1, le=256)
    """Instances of ``<name>_sync`` (each waits on one request's full generation). Triton
    2.51 unloads them one after another (about 1.2 s each on a small machine), which counts
    against the shutdown time."""

    dynamic_batching: bool = True
    """Enable dynamic batching on the BLS and ``<name>_sync`` models. The ensemble's steps
    never batch: with Triton 2.51 a batcher would answer a cancelled step request itself
    and leave the ensemble request in flight, and postprocessing must see cancelled
    requests to stop the engine."""

    max_queue_delay_microseconds: int = Field(default=0, ge=0, le=10_000_000)
    """Dynamic-batching queue delay of the BLS and ``<name>_sync`` models."""


def _sampling_section() -> type[_Section]:
    """The ``defaults`` section, derived from the request-parameter table: one field per
    parameter with a default the spec may override, its doc line from the table."""
    fields: dict[str, Any] = {}
    for p in REQUEST_PARAMETERS:
        if not p.spec_default:
            continue
        if p.name == "stream":
            fields[p.name] = (bool | None, Field(
                default=None, description="Stream by default (unset: the value of ``streaming``)."))
        elif p.kind == "words":
            fields[p.name] = (list[str], Field(
                default_factory=list, description=p.doc + " Used when the request gives none."))
        else:
            kind: type = bool if p.dtype is DType.BOOL else int if p.dtype.is_integer else float
            bounds = f" Allowed: {p.bounds_text}." if p.bounds_text else ""
            fields[p.name] = (kind, Field(default=p.default, description=p.doc + bounds))
    model: type[_Section] = create_model(  # type: ignore[call-overload]
        "SamplingSection", __base__=_Section, __module__=__name__, **fields)
    model.__doc__ = "Defaults applied when a request omits a sampling input."
    return model


SamplingSection = _sampling_section()


class Limits(_Section):
    """Server-side request limits."""

    max_prompt_bytes: int = Field(default=LIMITS.max_prompt_bytes, ge=1,
                                  le=LIMITS.max_prompt_bytes)
    """Largest prompt (``text_input`` or ``messages``) in UTF-8 bytes."""


class VllmSection(_Section):
    """Options of the vLLM backend (``backend: vllm`` only)."""

    engine_model: EngineModel = "tritonforge"
    """``tritonforge``: preprocessing -> tritonforge's vLLM engine model -> postprocessing
    in an ensemble; ``stock``: one model for Triton's own vLLM backend (``model.json``)."""

    enforce_eager: bool = False
    """Skip graph capture/compilation (faster start, slower steps)."""

    seed: int | None = Field(default=None, ge=0)
    """Engine random seed."""

    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Extra ``AsyncEngineArgs`` keyword arguments, for options the spec does not cover.
    Values may nest (e.g. ``compilation_config: {mode: 0}``); keys are checked against vLLM
    0.32's fields (and, for config fields, the config class's), unknown ones refused with the
    closest name. ``speculative_config`` adds options to the ``speculative`` section's (e.g.
    ``prompt_lookup_max`` for ``ngram``)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables set before vLLM is imported."""


class TensorRTLLMSection(_Section):
    """Options of the TensorRT-LLM backend (``backend: tensorrtllm`` only)."""

    runtime: Literal["cpp", "llmapi"] = "cpp"
    """``cpp``: NVIDIA's C++ backend (``backend: tensorrtllm``) over an engine built by the
    emitted ``build_engine.sh``; ``llmapi``: tritonforge's engine model over
    ``tensorrt_llm.LLM`` (PyTorch backend, no engine build; arguments in
    ``tensorrt_llm/1/model.yaml``). Both behind the same ensemble."""

    engine_dir: str | None = Field(default=None, min_length=1)
    """Folder of the built engine (required with runtime ``cpp``; written to the backend's
    ``gpt_model_path`` parameter)."""

    checkpoint_dir: str | None = Field(default=None, min_length=1)
    """Where ``build_engine.sh`` writes the converted checkpoint (unset:
    ``<engine_dir>-checkpoint``)."""

    max_beam_width: int = Field(default=1, ge=1, le=64)
    """Largest beam width the engine is built and run with."""

    parameters: dict[str, str] = Field(default_factory=dict)
    """Extra backend parameters by their documented names (e.g. ``gpu_weights_percent``),
    for knobs the spec does not cover (runtime ``cpp``)."""

    llm_args: dict[str, Any] = Field(default_factory=dict)
    """Extra ``tensorrt_llm.LLM()`` keyword arguments (runtime ``llmapi``), for options the
    spec does not cover (e.g. ``cuda_graph_config``)."""


class Spec(_Section):
    """A tritonforge deployment."""

    name: str
    """Served model name (the ensemble). Letters, digits, ``_``, ``-``, ``.`` (not first)."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if (msg := name_problem(value, "the served model name")) is not None:
            raise ValueError(msg)
        return value

    model: ModelSection = Field(default_factory=ModelSection)
    """The model."""

    backend: Backend = "vllm"
    """Engine: ``vllm`` or ``tensorrtllm``."""

    device: Device = "auto"
    """``cpu``, ``gpu`` or ``auto`` (GPU for TensorRT-LLM; vLLM picks its platform)."""

    batching: Batching = Field(default_factory=Batching)
    """Batching and scheduling."""

    kv_cache: KvCache = Field(default_factory=KvCache)
    """KV cache."""

    quantization: Quantization = "none"
    """Quantization: ``none``; TensorRT-LLM: ``fp8``, ``int8`` (weight-only), ``int4_awq``;
    vLLM: ``fp8``, ``awq``, ``gptq``, ``gguf`` (vLLM 0.32 has no GGUF support: tritonforge's
    engine model serves the file dequantized to the checkpoint's dtype)."""

    parallelism: Parallelism = Field(default_factory=Parallelism)
    """Tensor / pipeline parallelism."""

    speculative: Speculative = Field(default_factory=Speculative)
    """Speculative decoding."""

    lora: Lora = Field(default_factory=Lora)
    """LoRA adapters."""

    instances: Instances = Field(default_factory=Instances)
    """Pre/post-processing instances."""

    streaming: bool = True
    """Decoupled (streaming) engine and ensemble."""

    non_streaming_model: bool = True
    """With streaming on, also render ``<name>_sync``: a non-decoupled model for HTTP
    ``/generate`` and gRPC ModelInfer."""

    response_cache: bool = False
    """Enable Triton's response cache on the non-streaming path (``<name>_sync``, or the
    ensemble when streaming is off). Start tritonserver with ``--cache-config``."""

    defaults: SamplingSection = Field(default_factory=SamplingSection)  # type: ignore[valid-type]
    """Sampling defaults."""

    limits: Limits = Field(default_factory=Limits)
    """Request limits."""

    vllm: VllmSection = Field(default_factory=VllmSection)
    """vLLM options."""

    tensorrtllm: TensorRTLLMSection = Field(default_factory=TensorRTLLMSection)
    """TensorRT-LLM options."""

    @property
    def engine_kind(self) -> EngineKind:
        """Which engine serves the engine step."""
        if self.backend == "vllm":
            return EngineKind.VLLM
        return EngineKind.TRTLLM_LLMAPI if self.tensorrtllm.runtime == "llmapi" else EngineKind.TRTLLM_CPP
