"""The TensorRT-LLM backend's documented ``config.pbtxt`` parameter names (the allow-list).

The generator emits only these keys for the ``tensorrt_llm`` model, a spec's
``tensorrtllm.parameters`` may only use these keys, and ``tritonforge validate`` rejects any
other key: the backend ignores unknown keys silently, so a typo would otherwise go unseen.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BATCHING_STRATEGIES", "DECODING_MODES", "TRTLLM_PARAMETERS"]

TRTLLM_PARAMETERS: Final[frozenset[str]] = frozenset({
    "gpt_model_type",
    "batching_strategy",
    "engine_dir",
    "encoder_engine_dir",
    "max_beam_width",
    "exclude_input_in_output",
    "batch_scheduler_policy",
    "enable_chunked_context",
    "kv_cache_free_gpu_mem_fraction",
    "cross_kv_cache_fraction",
    "max_tokens_in_paged_kv_cache",
    "enable_kv_cache_reuse",
    "max_attention_window_size",
    "sink_token_length",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "normalize_log_probs",
    "gpu_device_ids",
    "participant_ids",
    "gpu_weights_percent",
    "decoding_mode",
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "lora_prefetch_dir",
    "multi_block_mode",
    "enable_context_fmha_fp32_acc",
    "cuda_graph_mode",
    "cuda_graph_cache_size",
    "guided_decoding_backend",
    "tokenizer_dir",
    "xgrammar_tokenizer_info_path",
    "executor_worker_path",
    "medusa_choices",
    "eagle_choices",
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
    "recv_poll_period_ms",
    "FORCE_CPU_ONLY_INPUT_TENSORS",
})

BATCHING_STRATEGIES: Final = ("inflight_fused_batching", "inflight_batching", "V1")
DECODING_MODES: Final = (
    "top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle",
)
