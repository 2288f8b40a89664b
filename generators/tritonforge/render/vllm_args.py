"""vLLM's ``AsyncEngineArgs`` fields, as upstream facts: ``vllm.engine_args`` is checked at
generate time without importing vLLM (which needs torch, and may not be installed where the
repository is generated).

The tables are vLLM 0.32.0's ``dataclasses.fields(AsyncEngineArgs)`` (init fields) and, for
each field whose type is one of vLLM's config dataclasses (and ``speculative_config``, a dict
vLLM turns into ``SpeculativeConfig``), that class's init fields. ``collect()`` reads the same
from the installed vLLM; ``tests/test_vllm_args.py`` keeps the two equal.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "CONFIG_ARGS",
    "ENGINE_ARGS",
    "MAPPING_ARGS",
    "VLLM_VERSION",
    "check_engine_args",
    "collect",
]

# -- generated from vLLM 0.32.0 by collect() ------------------------------------------------
VLLM_VERSION: Final = "0.32.0"
#: ``dataclasses.fields(AsyncEngineArgs)`` (init fields).
ENGINE_ARGS: Final[frozenset[str]] = frozenset({
    '_api_process_count', '_api_process_rank', 'additional_config', 'aggregate_engine_logging',
    'all2all_backend', 'allow_deprecated_quantization', 'allowed_local_media_path',
    'allowed_media_domains', 'async_scheduling', 'attention_backend', 'attention_config',
    'aux_output_config', 'block_size', 'code_revision', 'collect_detailed_traces',
    'compilation_config', 'config_format', 'convert', 'cp_kv_cache_interleave_size',
    'cpu_distributed_timeout_seconds', 'cpu_offload_gb', 'cpu_offload_params',
    'cudagraph_capture_sizes', 'cudagraph_metrics', 'custom_histogram_buckets',
    'data_parallel_address', 'data_parallel_backend', 'data_parallel_external_lb',
    'data_parallel_hybrid_lb', 'data_parallel_multi_port_external_lb', 'data_parallel_rank',
    'data_parallel_rpc_port', 'data_parallel_size', 'data_parallel_size_local',
    'data_parallel_start_rank', 'dbo_decode_token_threshold', 'dbo_prefill_token_threshold',
    'dcp_comm_backend', 'dcp_kv_cache_interleave_size', 'dcp_q_replicate',
    'decode_context_parallel_size', 'default_mm_loras', 'device_ids', 'diffusion_config',
    'disable_cascade_attn', 'disable_chunked_mm_input', 'disable_custom_all_reduce',
    'disable_hybrid_kv_cache_manager', 'disable_log_stats', 'disable_nccl_for_dp_synchronization',
    'disable_sliding_window', 'distributed_executor_backend', 'distributed_timeout_seconds',
    'download_dir', 'dp_sync_interval', 'dtype', 'ec_manager_config', 'ec_transfer_config',
    'elastic_ep_max_dp_size', 'enable_batch_sharded_sampling', 'enable_chunked_prefill',
    'enable_cumem_allocator', 'enable_dbo', 'enable_elastic_ep', 'enable_ep_weight_filter',
    'enable_eplb', 'enable_expert_parallel', 'enable_fault_tolerance',
    'enable_flashinfer_autotune', 'enable_hc_sp', 'enable_layerwise_nvtx_tracing',
    'enable_log_requests', 'enable_logging_iteration_details', 'enable_lora',
    'enable_mamba_cache_stochastic_rounding', 'enable_mamba_shared_prefix_checkpoint',
    'enable_mfu_metrics', 'enable_mixed_moe_lora_format', 'enable_mm_embeds',
    'enable_mm_processor_stats', 'enable_moe_shared_loras', 'enable_nccl_comm_suspend',
    'enable_prefix_caching', 'enable_prompt_embeds', 'enable_return_routed_experts',
    'enable_shm_tensor_arena', 'enable_sleep_mode', 'enable_tower_connector_lora',
    'enable_trace_replay', 'enforce_eager', 'engram_config', 'eplb_config',
    'expert_placement_strategy', 'fail_on_environ_validation', 'fault_tolerance_config',
    'fully_sharded_loras', 'gdn_prefill_backend', 'generation_config', 'gpu_memory_utilization',
    'hf_config_path', 'hf_overrides', 'hf_token', 'ignore_patterns', 'interleave_mm_strings',
    'io_processor_plugin', 'ir_op_priority', 'jit_monitor_mode', 'jit_monitor_verbose',
    'kda_decode_backend', 'kda_prefill_backend', 'kernel_config', 'kv_cache_dtype',
    'kv_cache_dtype_skip_layers', 'kv_cache_memory_bytes', 'kv_cache_metrics',
    'kv_cache_metrics_sample', 'kv_events_config', 'kv_offloading_backend', 'kv_offloading_size',
    'kv_sharing_fast_prefill', 'kv_transfer_config', 'language_model_only', 'limit_mm_per_prompt',
    'linear_backend', 'load_format', 'log_config_file', 'log_level', 'logging_config',
    'logits_processors', 'logprobs_mode', 'long_prefill_token_threshold',
    'long_prefill_token_threshold_adaptive', 'lora_dtype', 'lora_target_modules', 'mamba_backend',
    'mamba_block_size', 'mamba_cache_dtype', 'mamba_cache_mode', 'mamba_cache_philox_rounds',
    'mamba_config', 'mamba_ssm_cache_dtype', 'mamba_ssu_algorithm', 'master_addr', 'master_port',
    'max_cpu_loras', 'max_cudagraph_capture_size', 'max_logprobs', 'max_lora_cls_labels',
    'max_lora_rank', 'max_loras', 'max_model_len', 'max_num_active_seqs',
    'max_num_batched_tokens', 'max_num_queued_reqs', 'max_num_queued_tokens',
    'max_num_scheduled_tokens', 'max_num_seqs', 'max_parallel_loading_workers', 'media_io_kwargs',
    'mm_device_do_normalize', 'mm_encoder_attn_backend', 'mm_encoder_attn_dtype',
    'mm_encoder_fp8_scale_path', 'mm_encoder_fp8_scale_save_margin',
    'mm_encoder_fp8_scale_save_path', 'mm_encoder_only', 'mm_encoder_tp_mode',
    'mm_hasher_algorithm', 'mm_ipc_gpu_memory_gb', 'mm_processor_cache_gb',
    'mm_processor_cache_type', 'mm_processor_device', 'mm_processor_kwargs',
    'mm_shm_cache_max_object_size_mb', 'mm_tensor_ipc', 'model', 'model_class_overrides',
    'model_impl', 'model_loader_extra_config', 'model_weights', 'moe_backend', 'nnodes',
    'node_rank', 'num_gpu_blocks_override', 'numa_bind', 'numa_bind_cpus', 'numa_bind_nodes',
    'offload_backend', 'offload_group_size', 'offload_num_in_group', 'offload_params',
    'offload_prefetch_step', 'optimization_level', 'otlp_traces_endpoint',
    'override_generation_config', 'per_request_spec_decode_metrics', 'performance_mode',
    'pipeline_parallel_size', 'pooler_config', 'prefill_context_parallel_size',
    'prefill_schedule_interval', 'prefix_cache_retention_interval', 'prefix_caching_hash_algo',
    'prefix_match_unit', 'profiler_config', 'pt_load_map_location', 'quantization',
    'quantization_config', 'ray_workers_use_nsight', 'reasoning_config', 'reasoning_parser',
    'reasoning_parser_plugin', 'renderer_num_workers', 'replayssm_buffer_len',
    'return_sampling_mask', 'revision', 'runner', 'safetensors_load_strategy',
    'safetensors_prefetch_block_size', 'safetensors_prefetch_num_threads', 'scheduler_cls',
    'scheduler_reserve_full_isl', 'scheduling_policy', 'seed', 'served_model_name',
    'show_hidden_metrics_for_version', 'shutdown_timeout', 'skip_mm_profiling',
    'skip_tokenizer_init', 'sleep_mode_offload_cudagraph', 'sleep_preserve_parameter_names',
    'sparse_indexer_topk_backend', 'spec_method', 'spec_model', 'spec_tokens',
    'specialize_active_lora', 'speculative_config', 'stream_interval',
    'structured_outputs_config', 'swa_bounded_replay', 'tensor_parallel_size', 'tokenizer',
    'tokenizer_mode', 'tokenizer_revision', 'tokens_only', 'trust_remote_code', 'ubatch_size',
    'use_fp64_gumbel', 'use_replayssm', 'use_tqdm_on_load', 'video_pruning_method',
    'video_pruning_rate', 'watermark', 'watermark_config', 'weight_transfer_config', 'worker_cls',
    'worker_extension_cls',
})
#: Fields vLLM turns from a dict into one of its config classes: field -> (class, its fields).
CONFIG_ARGS: Final[dict[str, tuple[str, frozenset[str]]]] = {
    'attention_config': ('AttentionConfig', frozenset({
        'backend', 'backend_per_kind', 'disable_flashinfer_q_quantization',
        'flash_attn_max_num_splits_for_cuda_graph', 'flash_attn_version', 'flex_attn_block_m',
        'flex_attn_block_n', 'flex_attn_kv_block_size', 'flex_attn_q_block_size',
        'hisparse_config', 'indexer_kv_dtype', 'indexer_sparse_logits',
        'minimax_m3_msa_decode_backend', 'mla_prefill_backend', 'sparse_mla_force_mqa',
        'sparse_mla_prefill_workspace_factor', 'tokenspeed_mla_min_split_kv',
        'tq_max_kv_splits_for_cuda_graph', 'use_non_causal', 'use_prefill_query_quantization',
        'use_trtllm_attention',
    })),
    'aux_output_config': ('AuxOutputConfig', frozenset({
        'enable_return_routed_experts', 'max_bytes',
    })),
    'compilation_config': ('CompilationConfig', frozenset({
        'backend', 'cache_dir', 'compile_cache_save_format', 'compile_mm_encoder',
        'compile_ranges_endpoints', 'compile_sizes', 'cudagraph_capture_sizes',
        'cudagraph_copy_inputs', 'cudagraph_decoder_replay', 'cudagraph_mm_encoder',
        'cudagraph_mode', 'cudagraph_num_of_warmups', 'cudagraph_specialize_lora', 'custom_ops',
        'debug_dump_path', 'decoder_replay_cudagraph_capture_sizes',
        'decoder_replay_trim_threshold', 'dynamic_shapes_config',
        'encoder_cudagraph_max_frames_per_batch', 'encoder_cudagraph_max_vision_items_per_batch',
        'encoder_cudagraph_token_budgets', 'fast_moe_cold_start', 'inductor_compile_config',
        'inductor_passes', 'ir_enable_torch_wrap', 'max_cudagraph_capture_size', 'mode',
        'pass_config', 'splitting_ops', 'use_inductor_graph_partition',
    })),
    'ec_manager_config': ('EncoderCacheManagerConfig', frozenset({
        'encoder_cache_manager_cls', 'manager_config',
    })),
    'ec_transfer_config': ('ECTransferConfig', frozenset({
        'ec_buffer_device', 'ec_buffer_size', 'ec_connector', 'ec_connector_extra_config',
        'ec_connector_module_path', 'ec_ip', 'ec_port', 'ec_role', 'engine_id',
    })),
    'engram_config': ('EngramConfig', frozenset({
        'cpu_offload', 'dp_shared_memory', 'embedding_across_dp', 'use_thp',
    })),
    'eplb_config': ('EPLBConfig', frozenset({
        'communicator', 'enable_migration_batching', 'log_balancedness',
        'log_balancedness_interval', 'num_redundant_experts', 'policy', 'step_interval',
        'use_async', 'window_size',
    })),
    'fault_tolerance_config': ('FaultToleranceConfig', frozenset({
        'engine_recovery_timeout_sec',
    })),
    'ir_op_priority': ('IrOpPriorityConfig', frozenset({
        'fused_add_rms_norm', 'gelu_and_mul_sparse', 'rms_norm',
    })),
    'kernel_config': ('KernelConfig', frozenset({
        'enable_cutedsl_warmup', 'enable_flashinfer_autotune', 'enable_jit_warmup',
        'enable_rocm_segmented_attn_autotune', 'ir_op_priority', 'linear_backend',
        'linear_backend_per_quant', 'moe_backend', 'sparse_indexer_topk_backend',
    })),
    'kv_events_config': ('KVEventsConfig', frozenset({
        'buffer_steps', 'enable_kv_cache_events', 'endpoint', 'hwm', 'max_queue_size',
        'publisher', 'replay_endpoint', 'topic',
    })),
    'kv_transfer_config': ('KVTransferConfig', frozenset({
        'enable_permute_local_kv', 'engine_id', 'kv_buffer_device', 'kv_connector',
        'kv_connector_extra_config', 'kv_connector_module_path', 'kv_load_failure_policy',
        'kv_port', 'kv_role',
    })),
    'logging_config': ('LoggingConfig', frozenset({
        'configure_logging', 'formatter', 'log_level', 'pylogging_config_file',
    })),
    'mamba_config': ('MambaConfig', frozenset({
        'backend', 'enable_stochastic_rounding', 'ssu_algorithm',
        'stochastic_rounding_philox_rounds',
    })),
    'pooler_config': ('PoolerConfig', frozenset({
        'dimensions', 'enable_chunked_processing', 'enable_flash_late_interaction', 'logit_mean',
        'logit_sigma', 'max_embed_len', 'pooling_type', 'returned_token_ids', 'seq_pooling_type',
        'step_tag_id', 'task', 'tok_pooling_type', 'use_activation',
    })),
    'profiler_config': ('ProfilerConfig', frozenset({
        'active_iterations', 'capture_torch_profiler', 'delay_iterations',
        'detailed_trace_annotation', 'ignore_frontend', 'max_iterations', 'profiler',
        'proton_backend', 'proton_context', 'proton_data', 'proton_graph_attribution',
        'proton_hook', 'proton_mode', 'proton_output_format', 'proton_profiler_dir',
        'torch_profiler_activities', 'torch_profiler_dir', 'torch_profiler_dump_cuda_time_total',
        'torch_profiler_record_shapes', 'torch_profiler_use_gzip', 'torch_profiler_with_flops',
        'torch_profiler_with_memory', 'torch_profiler_with_stack', 'wait_iterations',
        'warmup_iterations',
    })),
    'reasoning_config': ('ReasoningConfig', frozenset({
        'reasoning_end_str', 'reasoning_parser', 'reasoning_start_str',
    })),
    'speculative_config': ('SpeculativeConfig', frozenset({
        'attention_backend', 'code_revision', 'disable_eagle_block_drop',
        'disable_padded_drafter_batch', 'draft_load_config', 'draft_model_config',
        'draft_parallel_config', 'draft_sample_method', 'draft_tensor_parallel_size',
        'dspark_draft_topk', 'enable_adaptive_verification', 'enforce_eager',
        'index_share_for_mtp_iteration', 'kv_cache_dtype', 'max_model_len', 'method', 'model',
        'moe_backend', 'num_speculative_tokens', 'num_speculative_tokens_per_batch_size',
        'parallel_drafting', 'prompt_lookup_max', 'prompt_lookup_min', 'quantization',
        'rejection_sample_method', 'revision', 'suffix_decoding_max_cached_requests',
        'suffix_decoding_max_spec_factor', 'suffix_decoding_max_tree_depth',
        'suffix_decoding_min_token_prob', 'synthetic_acceptance_length',
        'synthetic_acceptance_rates', 'target_model_config', 'target_parallel_config',
        'tensor_parallel_size', 'use_heterogeneous_vocab', 'use_local_argmax_reduction',
    })),
    'structured_outputs_config': ('StructuredOutputsConfig', frozenset({
        'backend', 'disable_additional_properties', 'disable_any_whitespace',
        'enable_in_reasoning', 'reasoning_parser', 'reasoning_parser_plugin',
    })),
    'weight_transfer_config': ('WeightTransferConfig', frozenset({
        'backend',
    })),
}
#: Fields that take a free-form mapping (any keys).
MAPPING_ARGS: Final[frozenset[str]] = frozenset({
    'additional_config', 'custom_histogram_buckets', 'default_mm_loras', 'diffusion_config',
    'hf_overrides', 'limit_mm_per_prompt', 'media_io_kwargs', 'mm_processor_kwargs',
    'model_class_overrides', 'model_loader_extra_config', 'override_generation_config',
    'pt_load_map_location', 'quantization_config', 'watermark_config',
})
# -------------------------------------------------------------------------------------------

_JSON_SCALARS: Final = (str, int, float, bool, type(None))


def collect() -> dict[str, Any]:
    """The same facts, read from the installed vLLM (imports it)."""
    import dataclasses
    import typing

    import vllm
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    def init_fields(cls: Any) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)

    configs: dict[str, tuple[str, frozenset[str]]] = {}
    mappings: set[str] = set()
    for f in dataclasses.fields(AsyncEngineArgs):
        if not f.init:
            continue
        options = typing.get_args(f.type) or (f.type,)
        classes = [a for a in options if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if classes:
            configs[f.name] = (classes[0].__name__, init_fields(classes[0]))
        elif "dict" in str(f.type):
            mappings.add(f.name)
    configs["speculative_config"] = ("SpeculativeConfig", init_fields(SpeculativeConfig))
    mappings.discard("speculative_config")
    return {"version": vllm.__version__, "engine_args": init_fields(AsyncEngineArgs),
            "config_args": configs, "mapping_args": frozenset(mappings)}


def _closest(name: str, names: Iterable[str], derived: Mapping[str, str] | None = None) -> str:
    best = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    if not best:
        return ""
    if derived and best[0] in derived:
        return f"; closest: {best[0]!r}, which the spec sets with {derived[best[0]]}"
    return f"; closest: {best[0]!r}"


def _json_problem(value: Any, path: str) -> str | None:
    """The first value under ``value`` that is not JSON (str, number, bool, null, list, map)."""
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            if (p := _json_problem(v, f"{path}[{i}]")) is not None:
                return p
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path}: mapping keys must be strings; got {k!r}"
            if (p := _json_problem(v, f"{path}.{k}")) is not None:
                return p
        return None
    return f"{path}: must be a string, number, boolean, null, list or mapping; got {value!r}"


def check_engine_args(args: Mapping[str, Any], path: str = "vllm.engine_args",
                      derived: Mapping[str, str] | None = None) -> list[str]:
    """One message per key of ``args`` that vLLM's ``AsyncEngineArgs`` would refuse;
    ``derived`` names the spec field that sets an argument (named in "closest" hints)."""
    out: list[str] = []
    for key in sorted(args):
        value = args[key]
        where = f"{path}.{key}"
        if key not in ENGINE_ARGS:
            hint = _closest(key, ENGINE_ARGS, derived) or (
                " (model-config overrides such as rope_scaling go under "
                f"{path}.hf_overrides)")
            out.append(f"{where}: not an AsyncEngineArgs field of vLLM {VLLM_VERSION}{hint}. "
                       "Fix: check the name against vLLM's engine arguments")
            continue
        if (p := _json_problem(value, where)) is not None:
            out.append(f"{p}. Fix: write it as YAML scalars, lists and mappings")
            continue
        if not isinstance(value, dict):
            continue
        if key in CONFIG_ARGS:
            cls, fields = CONFIG_ARGS[key]
            for sub in sorted(set(value) - fields):
                out.append(f"{where}.{sub}: not a field of vLLM's {cls}{_closest(sub, fields)}. "
                           f"Fix: use one of {', '.join(sorted(fields))}")
        elif key not in MAPPING_ARGS:
            out.append(f"{where}: vLLM's {key} takes a single value, not a mapping; got "
                       f"{value!r}. Fix: give one value")
    return out
