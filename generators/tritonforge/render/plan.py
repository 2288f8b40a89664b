"""From a validated spec to a plain description of every model in the repository.

All decisions (which models exist, their tensors from ``tritonforge.contract``, parameters,
ensemble wiring) are made here in Python; the Jinja templates only lay the result out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from tritonforge import contract as C
from tritonforge.render.commands import tokenizer_info_path
from tritonforge.render.escape import json_text
from tritonforge.render.trtllm_params import GUIDED_DECODING_BACKENDS, TRTLLM_INPUTS, TRTLLM_OUTPUTS
from tritonforge.spec.model import Spec

__all__ = [
    "CPU_PRIMITIVE_CACHE_CAPACITY",
    "PYTHON_MODULES",
    "ModelPlan",
    "RepoPlan",
    "StepPlan",
    "TensorPlan",
    "engine_args",
    "engine_env",
    "llm_args",
    "lora_adapters",
    "plan_repository",
    "sync_model_name",
]

PYTHON_MODULES: dict[str, str] = {
    C.MODEL_PREPROCESSING: "tritonforge.triton_models.preprocessing_model",
    C.MODEL_VLLM_ENGINE: "tritonforge.triton_models.engine_model",
    C.MODEL_POSTPROCESSING: "tritonforge.triton_models.postprocessing_model",
    "sync": "tritonforge.triton_models.sync_model",
    C.MODEL_BLS: "tritonforge.triton_models.bls_model",
}


# Where the LLM-API engine model reads its ``tensorrt_llm.LLM()`` arguments (the layout of
# upstream's ``all_models/llmapi`` model), relative to the model's folder.
LLMAPI_MODEL_YAML = "1/model.yaml"


@dataclass(frozen=True)
class TensorPlan:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False
    reshape_scalar: bool = False  # reshape: { shape: [ ] } (the C++ backend's scalar inputs)


@dataclass(frozen=True)
class StepPlan:
    model_name: str
    input_map: tuple[tuple[str, str], ...]  # (composing model input, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]  # (composing model output, ensemble tensor)


@dataclass
class ModelPlan:
    name: str
    kind: Literal["python", "tensorrtllm", "ensemble", "vllm_stock"]
    max_batch_size: int
    inputs: list[TensorPlan] = field(default_factory=list)
    outputs: list[TensorPlan] = field(default_factory=list)
    decoupled: bool = False
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"
    dynamic_batching: bool = False
    queue_delay_us: int = 0
    max_queue_size: int | None = None
    parameters: list[tuple[str, str]] = field(default_factory=list)
    response_cache: bool = False
    steps: list[StepPlan] = field(default_factory=list)
    python_module: str | None = None
    description: str = ""
    files: dict[str, str] = field(default_factory=dict)  # extra files under the model dir


@dataclass
class RepoPlan:
    spec: Spec
    models: list[ModelPlan]


def _tensors(tensors: tuple[C.Tensor, ...], *, ragged: tuple[str, ...] = ()) -> list[TensorPlan]:
    return [TensorPlan(t.name, t.dtype.value, t.dims, t.optional, t.name in ragged)
            for t in tensors]


def _b(v: bool) -> str:
    return "true" if v else "false"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def sync_model_name(spec: Spec) -> str:
    return f"{spec.name}_sync"


def lora_adapters(spec: Spec) -> dict[str, dict[str, Any]]:
    """``{name: {"id": n, "path": p}}`` with ids 1.. in name order (stable across runs)."""
    if not spec.lora.enabled:
        return {}
    return {name: {"id": i, "path": spec.lora.adapters[name]}
            for i, name in enumerate(sorted(spec.lora.adapters), start=1)}


def _speculative_config(spec: Spec) -> dict[str, Any] | None:
    sp = spec.speculative
    if sp.method == "none":
        return None
    cfg: dict[str, Any] = {"num_speculative_tokens": sp.num_speculative_tokens}
    if sp.method != "draft_model":
        cfg["method"] = sp.method
    if sp.draft_model is not None:
        cfg["model"] = sp.draft_model
    return cfg


def _coalescing(bt: Any) -> dict[str, str]:
    """The engine model's coalescing parameters (``batching.stream_interval_ms``), when on."""
    if not bt.stream_interval_ms:
        return {}
    return {C.Param.STREAM_INTERVAL_MS.value: str(bt.stream_interval_ms),
            C.Param.COALESCE_FROM.value: str(bt.coalesce_from_streams)}


def engine_args(spec: Spec, *, include_model: bool = False) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keyword arguments derived from the spec."""
    bt, kv, par = spec.batching, spec.kv_cache, spec.parallelism
    args: dict[str, Any] = {
        "max_model_len": spec.model.max_model_len,
        "max_num_seqs": bt.max_num_seqs if bt.max_num_seqs is not None else bt.max_batch_size,
        "enable_prefix_caching": kv.prefix_caching,
        "enable_chunked_prefill": bt.chunked_prefill,
        "gpu_memory_utilization": kv.gpu_memory_fraction,
        "kv_cache_dtype": kv.dtype,
        "tensor_parallel_size": par.tensor_parallel_size,
        "pipeline_parallel_size": par.pipeline_parallel_size,
        "enforce_eager": spec.vllm.enforce_eager,
        "dtype": spec.model.dtype,
    }
    if include_model:
        args["model"] = spec.model.path
    if spec.model.tokenizer is not None:
        args["tokenizer"] = spec.model.tokenizer
    if bt.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = bt.max_num_batched_tokens
    # vLLM 0.32 has no GGUF method or loader: tritonforge's engine model serves the GGUF
    # dequantized (runtime.models converts it once), so nothing is passed for it.
    if spec.quantization not in ("none", "gguf"):
        args["quantization"] = spec.quantization
    if (sc := _speculative_config(spec)) is not None:
        args["speculative_config"] = sc
    if spec.lora.enabled:
        args["enable_lora"] = True
        args["max_loras"] = spec.lora.max_adapters
        args["max_lora_rank"] = spec.lora.max_rank
    if spec.vllm.seed is not None:
        args["seed"] = spec.vllm.seed
    if spec.device != "gpu" and par.tensor_parallel_size * par.pipeline_parallel_size == 1:
        # One rank on a CPU: the model runs inside vLLM's engine-core process (UniProcExecutor)
        # instead of a worker process of its own that the engine core drives through shared
        # memory, where each side busy-polls for the other on the cores the model computes
        # on. Measured with benchmarks/bench_peer.py (docs in README, Measured). vLLM keeps it
        # only with VLLM_ENABLE_V1_MULTIPROCESSING=0 (see engine_env); its AsyncLLM, which the
        # engine model runs, keeps the engine core in a process of its own either way.
        args["distributed_executor_backend"] = CPU_SINGLE_RANK_EXECUTOR
    for key, value in spec.vllm.engine_args.items():
        if key == "speculative_config" and isinstance(value, dict) and isinstance(args.get(key), dict):
            args[key] = {**args[key], **value}  # options beyond the speculative section's
        else:
            args[key] = value
    return args


CPU_SINGLE_RANK_EXECUTOR = "uni"
"""vLLM's executor for an engine of one rank on a CPU (see engine_args)."""

CPU_PRIMITIVE_CACHE_CAPACITY = 128
"""oneDNN and ideep primitive cache entries in the vLLM CPU engine (see engine_env)."""


def engine_env(spec: Spec) -> dict[str, str]:
    """Environment the vLLM engine model sets before importing vLLM."""
    env: dict[str, str] = {}
    if spec.device != "gpu":
        space = spec.kv_cache.cpu_space_gib if spec.kv_cache.cpu_space_gib is not None else 4
        env["VLLM_CPU_KVCACHE_SPACE"] = _num(space)
        # vLLM's CPU linear layers keep a oneDNN primitive per distinct token count of a step,
        # and oneDNN/ideep each cache up to 1024 (never freed): the worker grows through a long
        # run unless capped (measured in docs/reliability.md, Soak). vllm.env overrides both.
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(CPU_PRIMITIVE_CACHE_CAPACITY)
        env["LRU_CACHE_CAPACITY"] = str(CPU_PRIMITIVE_CACHE_CAPACITY)
        if engine_args(spec).get("distributed_executor_backend") == CPU_SINGLE_RANK_EXECUTOR:
            # vLLM's CPU platform turns "uni" into its multiprocess executor unless this is 0.
            # It is read by vLLM's synchronous LLMEngine (not used by the engine model) and when
            # the engine's configuration is built; AsyncLLM starts its engine core either way.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if spec.parallelism.gpu_device_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.parallelism.gpu_device_ids))
    env.update(spec.vllm.env)
    return env


def sampling_defaults(spec: Spec) -> dict[str, Any]:
    """The request defaults preprocessing applies: the table's, as the spec sets them."""
    d = spec.defaults
    out = {name: getattr(d, name) for name in C.SAMPLING_DEFAULTS}
    out["stream"] = spec.streaming if d.stream is None else d.stream
    out["stop_words"] = list(d.stop_words)
    return out



def _trtllm_parameters(spec: Spec) -> list[tuple[str, str]]:
    bt, kv, t = spec.batching, spec.kv_cache, spec.tensorrtllm
    assert t.engine_dir is not None  # guaranteed by the spec rules
    params: dict[str, str] = {
        "gpt_model_type": bt.strategy,
        "gpt_model_path": t.engine_dir,
        "max_beam_width": str(t.max_beam_width),
        "batch_scheduler_policy": bt.scheduler_policy,
        "enable_chunked_context": _b(bt.chunked_prefill),
        "kv_cache_free_gpu_mem_fraction": _num(kv.gpu_memory_fraction),
        "enable_kv_cache_reuse": _b(kv.prefix_caching),
        "exclude_input_in_output": _b(spec.defaults.exclude_input_in_output),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        # Guided decoding (structured outputs) on xgrammar, with the tokenizer info
        # build_engine.sh writes; tokenizer_dir is read too, but only the Python backend uses it.
        "guided_decoding_backend": GUIDED_DECODING_BACKENDS[0],
        "xgrammar_tokenizer_info_path": tokenizer_info_path(spec),
        "tokenizer_dir": "",
    }
    if kv.max_tokens is not None:
        params["max_tokens_in_paged_kv_cache"] = str(kv.max_tokens)
    if kv.sliding_window is not None:
        params["max_attention_window_size"] = str(kv.sliding_window)
    if kv.sink_tokens is not None:
        params["sink_token_length"] = str(kv.sink_tokens)
    if kv.host_offload_bytes is not None:
        params["kv_cache_host_memory_bytes"] = str(kv.host_offload_bytes)
    if spec.parallelism.gpu_device_ids is not None:
        params["gpu_device_ids"] = ",".join(map(str, spec.parallelism.gpu_device_ids))
    if spec.speculative.method != "none":
        params["decoding_mode"] = spec.speculative.method
    params.update(t.parameters)
    return sorted(params.items())


def _cpp_engine_inputs() -> tuple[C.Tensor, ...]:
    """The engine contract minus the request parameters the C++ backend has no input for
    (tritonforge's own engine models declare them all, so any ensemble can feed them)."""
    absent = {p.engine_name for p in C.REQUEST_PARAMETERS if C.EngineKind.TRTLLM_CPP not in p.engines}
    return tuple(t for t in C.ENGINE_INPUTS if t.name not in absent)


def _cpp_tensors(tensors: tuple[C.Tensor, ...], facts: dict[str, Any]) -> list[TensorPlan]:
    """The C++ backend's declaration of each contract tensor, exactly as upstream's template
    declares it (``render.trtllm_params``): dtype, dims, optional, ragged, scalar reshape."""
    out = []
    for t in tensors:
        f = facts[t.name]  # a contract tensor the backend lacks fails here, at render time
        out.append(TensorPlan(t.name, f.dtype or t.dtype.value, f.dims, f.optional, f.ragged,
                              f.scalar))
    return out


def llm_args(spec: Spec) -> dict[str, Any]:
    """``tensorrt_llm.LLM()`` keyword arguments derived from the spec (runtime ``llmapi``),
    written to the engine model's ``1/model.yaml``."""
    bt, kv, par, t = spec.batching, spec.kv_cache, spec.parallelism, spec.tensorrtllm
    kv_cfg: dict[str, Any] = {"enable_block_reuse": kv.prefix_caching,
                              "free_gpu_memory_fraction": kv.gpu_memory_fraction}
    if kv.max_tokens is not None:
        kv_cfg["max_tokens"] = kv.max_tokens
    if kv.dtype != "auto":
        kv_cfg["dtype"] = kv.dtype
    args: dict[str, Any] = {
        "model": spec.model.path,
        "backend": "pytorch",
        "dtype": spec.model.dtype,
        "tensor_parallel_size": par.tensor_parallel_size,
        "pipeline_parallel_size": par.pipeline_parallel_size,
        "max_batch_size": bt.max_batch_size,
        "max_seq_len": spec.model.max_model_len,
        "enable_chunked_prefill": bt.chunked_prefill,
        "kv_cache_config": kv_cfg,
        # structured outputs (SamplingParams.guided_decoding) need the LLM's grammar backend
        "guided_decoding_backend": GUIDED_DECODING_BACKENDS[0],
    }
    if spec.model.tokenizer is not None:
        args["tokenizer"] = spec.model.tokenizer
    if bt.max_num_batched_tokens is not None:
        args["max_num_tokens"] = bt.max_num_batched_tokens
    sp = spec.speculative
    if sp.method == "eagle":
        args["speculative_config"] = {"decoding_type": "Eagle",
                                      "max_draft_len": sp.num_speculative_tokens,
                                      "speculative_model_dir": sp.draft_model}
    if spec.lora.enabled:
        args["enable_lora"] = True
        args["lora_config"] = {
            "lora_dir": [spec.lora.adapters[n] for n in sorted(spec.lora.adapters)],
            "max_lora_rank": spec.lora.max_rank,
            "max_loras": spec.lora.max_adapters,
        }
    args.update(t.llm_args)
    return args


def _llmapi_env(spec: Spec) -> dict[str, str]:
    """Environment the LLM-API engine model sets before importing TensorRT-LLM."""
    env: dict[str, str] = {}
    if spec.parallelism.gpu_device_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.parallelism.gpu_device_ids))
    return env


def _python_model(name: str, module_key: str, spec: Spec, *, inputs: list[TensorPlan],
                  outputs: list[TensorPlan], params: dict[str, str], count: int,
                  decoupled: bool = False, kind: str = "KIND_CPU", dynamic: bool | None = None,
                  delay: int | None = None, description: str = "") -> ModelPlan:
    inst = spec.instances
    return ModelPlan(
        name=name, kind="python", max_batch_size=spec.batching.max_batch_size,
        inputs=inputs, outputs=outputs, decoupled=decoupled, instance_count=count,
        instance_kind=kind,
        dynamic_batching=inst.dynamic_batching if dynamic is None else dynamic,
        queue_delay_us=inst.max_queue_delay_microseconds if delay is None else delay,
        parameters=sorted(params.items()), python_module=PYTHON_MODULES[module_key],
        description=description,
    )


def _stock_plan(spec: Spec) -> RepoPlan:
    files = {"1/model.json": json_text(engine_args(spec, include_model=True), indent=2) + "\n"}
    adapters = lora_adapters(spec)
    if adapters:
        files["1/multi_lora.json"] = json_text(
            {name: a["path"] for name, a in adapters.items()}, indent=2) + "\n"
    model = ModelPlan(
        name=spec.name, kind="vllm_stock", max_batch_size=0, decoupled=True,
        instance_count=1, instance_kind="KIND_MODEL", files=files,
        description="Triton's own vLLM backend; engine arguments in 1/model.json.",
    )
    return RepoPlan(spec, [model])


def plan_repository(spec: Spec) -> RepoPlan:
    """Describe every model of the repository ``spec`` renders into."""
    if spec.backend == "vllm" and spec.vllm.engine_model == "stock":
        return _stock_plan(spec)

    s, inst, bt = spec, spec.instances, spec.batching
    tokenizer = s.model.tokenizer if s.model.tokenizer is not None else s.model.path
    is_vllm = s.backend == "vllm"
    kind = s.engine_kind
    own_engine = kind is not C.EngineKind.TRTLLM_CPP  # tritonforge's engine model (skeleton)
    engine_name = C.MODEL_VLLM_ENGINE if is_vllm else C.MODEL_TENSORRT_LLM
    adapters = lora_adapters(s)

    # The C++ backend with LoRA: preprocessing sends an adapter's weights with its first
    # request (contract.LORA_ENGINE_INPUTS); absent from a response, Triton's ensemble
    # leaves the engine's optional input out (seen on 2.51).
    lora_weights = kind is C.EngineKind.TRTLLM_CPP and s.lora.enabled
    lora_inputs = C.LORA_ENGINE_INPUTS if lora_weights else ()
    pre_outputs = C.PREPROCESSING_OUTPUTS + tuple(
        t.renamed(C.pre_output(t.name), optional=False) for t in lora_inputs)

    # No dynamic batcher on any step of the ensemble: when a client cancels, Triton's ensemble
    # scheduler cancels the next step's request, and a batcher answers a cancelled request
    # itself -- after which Triton 2.51 never releases the ensemble request (it stays
    # "in flight" until the exit timeout). Without a batcher the step's model gets the request
    # and answers it (postprocessing also stops the engine then; see postprocessing_model).
    pre = _python_model(
        C.MODEL_PREPROCESSING, C.MODEL_PREPROCESSING, s,
        inputs=_tensors(C.PREPROCESSING_INPUTS), outputs=_tensors(pre_outputs),
        count=inst.preprocessing, dynamic=False,
        params={
            C.Param.MODEL.value: s.model.path,
            C.Param.TOKENIZER.value: tokenizer,
            C.Param.CHAT_TEMPLATE.value: s.model.chat_template,
            C.Param.SAMPLING_DEFAULTS.value: json_text(sampling_defaults(s)),
            C.Param.ENGINE_KIND.value: kind.value,
            C.Param.MAX_MODEL_LEN.value: str(s.model.max_model_len),
            C.Param.MAX_PROMPT_BYTES.value: str(s.limits.max_prompt_bytes),
            C.Param.LORA_ADAPTERS.value: json_text(adapters),
            **({C.Param.ENGINE_DECOUPLED.value: _b(s.streaming)}
               if kind is C.EngineKind.TRTLLM_CPP else {}),
        },
        description="Validates a request, tokenizes it and fills the spec's defaults.",
    )
    post = _python_model(
        C.MODEL_POSTPROCESSING, C.MODEL_POSTPROCESSING, s,
        inputs=_tensors(C.POSTPROCESSING_INPUTS), outputs=_tensors(C.POSTPROCESSING_OUTPUTS),
        count=inst.postprocessing, dynamic=False,
        params={
            C.Param.MODEL.value: s.model.path,
            C.Param.TOKENIZER.value: tokenizer,
            C.Param.SKIP_SPECIAL_TOKENS.value: _b(s.model.skip_special_tokens),
            C.Param.ENGINE_MODEL.value: engine_name,
        },
        description="Detokenizes engine output incrementally (per request key).",
    )
    if is_vllm:
        engine = _python_model(
            C.MODEL_VLLM_ENGINE, C.MODEL_VLLM_ENGINE, s,
            inputs=_tensors(C.ENGINE_INPUTS),
            outputs=_tensors(C.ENGINE_OUTPUTS + C.ENGINE_EXTRA_OUTPUTS),
            count=1, kind="KIND_MODEL", decoupled=s.streaming, dynamic=False,
            params={
                **({C.Param.MAX_QUEUE_SIZE.value: str(bt.max_queue_size)}
                   if bt.max_queue_size is not None else {}),
                **_coalescing(bt),
                C.Param.MODEL.value: s.model.path,
                C.Param.ENGINE_ARGS.value: json_text(engine_args(s)),
                C.Param.LORA_ADAPTERS.value: json_text(adapters),
                C.Param.ENGINE_ENV.value: json_text(engine_env(s)),
                C.Param.ENGINE_KIND.value: kind.value,
            },
            description="vLLM engine (continuous batching) speaking the TensorRT-LLM "
                        "engine tensor contract.",
        )
        engine_outputs = {t.name for t in C.ENGINE_OUTPUTS + C.ENGINE_EXTRA_OUTPUTS}
    elif own_engine:  # TensorRT-LLM's LLM API (PyTorch backend) under the same skeleton
        engine = _python_model(
            C.MODEL_TENSORRT_LLM, C.MODEL_VLLM_ENGINE, s,
            inputs=_tensors(C.ENGINE_INPUTS),
            outputs=_tensors(C.ENGINE_OUTPUTS + C.ENGINE_EXTRA_OUTPUTS),
            count=1, kind="KIND_MODEL", decoupled=s.streaming, dynamic=False,
            params={
                **({C.Param.MAX_QUEUE_SIZE.value: str(bt.max_queue_size)}
                   if bt.max_queue_size is not None else {}),
                **_coalescing(bt),
                C.Param.MODEL.value: s.model.path,
                C.Param.LORA_ADAPTERS.value: json_text(adapters),
                C.Param.ENGINE_ENV.value: json_text(_llmapi_env(s)),
                C.Param.ENGINE_KIND.value: kind.value,
            },
            description="TensorRT-LLM's LLM API (tensorrt_llm.LLM, PyTorch backend; arguments "
                        "in 1/model.yaml) speaking the TensorRT-LLM engine tensor contract.",
        )
        engine.files[LLMAPI_MODEL_YAML] = (
            "# Generated by tritonforge: tensorrt_llm.LLM() keyword arguments (change the spec,\n"
            "# not this file). Read by the engine model at load.\n"
            + yaml.safe_dump(llm_args(s), sort_keys=True, default_flow_style=False))
        engine_outputs = {t.name for t in C.ENGINE_OUTPUTS + C.ENGINE_EXTRA_OUTPUTS}
    else:
        engine = ModelPlan(
            name=C.MODEL_TENSORRT_LLM, kind="tensorrtllm", max_batch_size=bt.max_batch_size,
            inputs=_cpp_tensors(_cpp_engine_inputs() + lora_inputs, TRTLLM_INPUTS),
            outputs=_cpp_tensors(C.ENGINE_OUTPUTS, TRTLLM_OUTPUTS), decoupled=s.streaming, instance_count=1,
            instance_kind="KIND_CPU", dynamic_batching=True,
            queue_delay_us=bt.max_queue_delay_microseconds, max_queue_size=bt.max_queue_size,
            parameters=_trtllm_parameters(s),
            description="TensorRT-LLM in-flight batcher (C++ backend).",
        )
        engine_outputs = {t.name for t in C.ENGINE_OUTPUTS}

    # --- ensemble wiring, from the contract -------------------------------------------
    def t_pre(name: str) -> str:
        return f"{C.MODEL_PREPROCESSING}__{name}"

    def t_eng(name: str) -> str:
        return f"{engine_name}__{name}"

    features = ("lora",) if s.lora.enabled else ()
    engine_in: list[tuple[str, str]] = []
    for n in C.engine_inputs_for(kind, features):
        if n == "streaming" and not s.streaming:
            continue  # a non-decoupled engine must never receive streaming=true
        engine_in.append((n, t_pre(C.pre_output(n))))
    engine_in += [(t.name, t_pre(C.pre_output(t.name))) for t in lora_inputs]
    post_in: list[tuple[str, str]] = []
    for n, (step, src) in C.POSTPROCESSING_SOURCES.items():
        if step == "engine":
            if src not in engine_outputs:
                continue
            post_in.append((n, t_eng(src)))
        else:
            post_in.append((n, t_pre(src)))
    pre_used = sorted({t for _, t in engine_in + post_in if t.startswith(t_pre(""))})
    eng_used = sorted({t for _, t in post_in if t.startswith(t_eng(""))})
    steps = [
        StepPlan(C.MODEL_PREPROCESSING,
                 tuple((t.name, t.name) for t in C.ENSEMBLE_INPUTS),
                 tuple((t[len(t_pre("")):], t) for t in pre_used)),
        StepPlan(engine_name, tuple(engine_in),
                 tuple((t[len(t_eng("")):], t) for t in eng_used)),
        StepPlan(C.MODEL_POSTPROCESSING, tuple(post_in),
                 tuple((t.name, t.name) for t in C.ENSEMBLE_OUTPUTS)),
    ]
    ensemble = ModelPlan(
        name=s.name, kind="ensemble", max_batch_size=bt.max_batch_size,
        inputs=_tensors(C.ENSEMBLE_INPUTS), outputs=_tensors(C.ENSEMBLE_OUTPUTS),
        steps=steps, response_cache=s.response_cache and not s.streaming,
        description="The served model: preprocessing -> engine -> postprocessing.",
    )
    models = [ensemble, pre, engine, post]
    if s.streaming and s.non_streaming_model:
        sync = _python_model(
            sync_model_name(s), "sync", s,
            inputs=_tensors(C.ENSEMBLE_INPUTS), outputs=_tensors(C.ENSEMBLE_OUTPUTS),
            count=inst.sync, params={C.Param.TARGET_MODEL.value: s.name,
                                     C.Param.ENGINE_MODEL.value: engine_name},
            description="Non-decoupled twin of the ensemble for /generate and ModelInfer.",
        )
        sync.response_cache = s.response_cache
        models.append(sync)
    if inst.bls > 0:
        models.append(_python_model(
            C.MODEL_BLS, C.MODEL_BLS, s,
            inputs=_tensors(C.ENSEMBLE_INPUTS), outputs=_tensors(C.ENSEMBLE_OUTPUTS),
            count=inst.bls, decoupled=s.streaming,
            params={C.Param.TARGET_MODEL.value: engine_name,
                    C.Param.ENGINE_KIND.value: kind.value,
                    C.Param.MODEL.value: s.model.path,
                    C.Param.TOKENIZER.value: tokenizer,
                    C.Param.SKIP_SPECIAL_TOKENS.value: _b(s.model.skip_special_tokens)},
            description="The same chain as the ensemble, in code (BLS): cancellable.",
        ))
    return RepoPlan(s, sorted(models, key=lambda m: m.name))
