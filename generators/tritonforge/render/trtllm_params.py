"""Facts about the TensorRT-LLM C++ backend's ``tensorrt_llm`` model (one table, kept here).

Source: NVIDIA/TensorRT-LLM, ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/
config.pbtxt`` at commit ``0c8de69a1ca6213eebb20a51873890ff128666c2`` (read 2026-12-02 with
the search tool; upstream removed the C++-engine templates afterwards, see
``docs/tensorrt-llm.md``). Re-read that file before changing anything here: names written
from memory are how ``engine_dir`` (the template's *placeholder* for the engine folder)
ended up as a parameter key, which the backend never reads (its key is ``gpt_model_path``).

* :data:`TRTLLM_PARAMETERS` -- every ``parameters`` key the template declares. The backend
  ignores unknown keys silently, so the generator writes only these, a spec's
  ``tensorrtllm.parameters`` may use only these, and ``tritonforge validate`` refuses others.
* :data:`TRTLLM_INPUTS` / :data:`TRTLLM_OUTPUTS` -- every tensor the template declares:
  dtype, dims (without the batch dim), whether it is optional, ragged, and whether the
  template reshapes it to a scalar (``reshape: { shape: [ ] }``). A dtype of ``None`` is a
  template placeholder (``${logits_datatype}`` and the like): set per deployment.
* :data:`TRTLLM_PLACEHOLDERS` -- the template's placeholder names that people mistake for
  keys, with the key each one fills.
* :data:`TRTLLM_ALWAYS_READ` -- the keys the backend reads without a default: a config
  without them does not load. Source: ``triton_backend/inflight_batcher_llm/src/
  model_instance_state.cc`` (``getGuidedDecodingConfigFromParams`` reads ``tokenizer_dir``,
  ``xgrammar_tokenizer_info_path`` and ``guided_decoding_backend`` outside any ``try``) and
  ``model_state.cc`` (``GetParameter<std::string>`` throws "Cannot find parameter with
  name" for a missing key), same commit. An empty value (or the template's ``${...}``) turns
  guided decoding off; ``guided_decoding_backend`` must otherwise be ``xgrammar``, and the
  tokenizer-info file must exist (``TLLM_CHECK_WITH_INFO``), a JSON object with
  ``encoded_vocab``, ``tokenizer_str`` and ``stop_token_ids``.
* :data:`XGRAMMAR_TOKENIZER_INFO_SCRIPT` / :data:`XGRAMMAR_TOKENIZER_INFO_FILE` -- how
  TensorRT-LLM itself writes that file: ``examples/generate_xgrammar_tokenizer_info.py
  --model_dir HF_FOLDER --output_dir DIR`` writes ``DIR/xgrammar_tokenizer_info.json``
  (NVIDIA/TensorRT-LLM ``examples/generate_xgrammar_tokenizer_info.py``, and the backend's
  ``docs/guided_decoding.md``, "C++ Backend").

tritonforge's engine contract (``tritonforge.contract.ENGINE_INPUTS``/``ENGINE_OUTPUTS``)
uses these names; ``tests/test_trtllm_facts.py`` checks that every contract tensor the C++
backend gets agrees with this table, and that every generated ``tensorrt_llm`` config does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "BATCHING_STRATEGIES",
    "DECODING_MODES",
    "GUIDED_DECODING_BACKENDS",
    "TRTLLM_ALWAYS_READ",
    "TRTLLM_INPUTS",
    "TRTLLM_OUTPUTS",
    "TRTLLM_PARAMETERS",
    "TRTLLM_PLACEHOLDERS",
    "TRTLLM_SOURCE",
    "XGRAMMAR_TOKENIZER_INFO_FILE",
    "XGRAMMAR_TOKENIZER_INFO_SCRIPT",
    "TensorFact",
]

TRTLLM_SOURCE: Final = (
    "NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:"
    "triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
)


@dataclass(frozen=True)
class TensorFact:
    """One tensor of the upstream ``tensorrt_llm`` model."""

    dtype: str | None  # config.pbtxt spelling (TYPE_INT32); None: a template placeholder
    dims: tuple[int, ...]
    optional: bool = False  # inputs only
    ragged: bool = False  # allow_ragged_batch (inputs only)
    scalar: bool = False  # reshape: { shape: [ ] } (inputs only)


def _s(dtype: str, optional: bool = True) -> TensorFact:
    """A [1] input the template reshapes to a scalar."""
    return TensorFact(dtype, (1,), optional=optional, scalar=True)


def _r(dtype: str | None, dims: tuple[int, ...]) -> TensorFact:
    """An optional ragged input."""
    return TensorFact(dtype, dims, optional=True, ragged=True)


_I32, _I64, _U64, _FP16, _FP32, _BOOL, _STR, _U8 = (
    "TYPE_INT32", "TYPE_INT64", "TYPE_UINT64", "TYPE_FP16", "TYPE_FP32", "TYPE_BOOL",
    "TYPE_STRING", "TYPE_UINT8",
)

TRTLLM_INPUTS: Final[dict[str, TensorFact]] = {
    "input_ids": _r(_I32, (-1,)),
    "encoder_input_features": _r(None, (-1, -1)),
    "encoder_output_lengths": _s(_I32),
    "input_lengths": _s(_I32, optional=False),
    "request_output_len": _s(_I32, optional=False),
    "num_return_sequences": _s(_I32),
    "draft_input_ids": _r(_I32, (-1,)),
    "decoder_input_ids": _r(_I32, (-1,)),
    "decoder_input_lengths": _s(_I32),
    "draft_logits": _r(None, (-1, -1)),
    "draft_acceptance_threshold": _s(_FP32),
    "end_id": _s(_I32),
    "pad_id": _s(_I32),
    "stop_words_list": _r(_I32, (2, -1)),
    "bad_words_list": _r(_I32, (2, -1)),
    "embedding_bias": _r(_FP32, (-1,)),
    "beam_width": _s(_I32),
    "temperature": _s(_FP32),
    "runtime_top_k": _s(_I32),
    "runtime_top_p": _s(_FP32),
    "runtime_top_p_min": _s(_FP32),
    "runtime_top_p_decay": _s(_FP32),
    "runtime_top_p_reset_ids": _s(_I32),
    "len_penalty": _s(_FP32),
    "early_stopping": _s(_BOOL),
    "repetition_penalty": _s(_FP32),
    "min_tokens": _s(_I32),
    "beam_search_diversity_rate": _s(_FP32),
    "presence_penalty": _s(_FP32),
    "frequency_penalty": _s(_FP32),
    "seed": _s(_U64),
    "return_log_probs": _s(_BOOL),
    "return_context_logits": _s(_BOOL),
    "return_generation_logits": _s(_BOOL),
    "return_perf_metrics": _s(_BOOL),
    "return_num_input_tokens": _s(_BOOL),
    "return_num_output_tokens": _s(_BOOL),
    "exclude_input_in_output": _s(_BOOL),
    "stop": _s(_BOOL),
    "streaming": _s(_BOOL),
    "prompt_embedding_table": _r(None, (-1, -1)),
    "prompt_table_extra_ids": _r(_U64, (-1,)),
    "prompt_vocab_size": _s(_I32),
    "cross_attention_mask": _r(_BOOL, (-1, -1)),
    "mrope_rotary_cos_sin": TensorFact(_FP32, (-1,), optional=True),
    "mrope_position_deltas": TensorFact(_I64, (1,), optional=True),
    "lora_task_id": _s(_U64),
    "lora_weights": _r(_FP16, (-1, -1)),
    "lora_config": _r(_I32, (-1, 3)),
    "context_phase_params": _r(_U8, (-1,)),
    "skip_cross_attn_blocks": _r(_BOOL, (1,)),
    "retention_token_range_starts": _r(_I32, (-1,)),
    "retention_token_range_ends": _r(_I32, (-1,)),
    "retention_token_range_priorities": _r(_I32, (-1,)),
    "retention_token_range_durations_ms": _r(_I32, (-1,)),
    "retention_decode_priority": _r(_I32, (1,)),
    "retention_decode_duration_ms": _r(_I32, (1,)),
    "guided_decoding_guide_type": _r(_STR, (1,)),
    "guided_decoding_guide": _r(_STR, (1,)),
    "lookahead_window_size": _r(_I32, (1,)),
    "lookahead_ngram_size": _r(_I32, (1,)),
    "lookahead_verification_set_size": _r(_I32, (1,)),
}

TRTLLM_OUTPUTS: Final[dict[str, TensorFact]] = {
    "output_ids": TensorFact(_I32, (-1, -1)),
    "sequence_length": TensorFact(_I32, (-1,)),
    "cum_log_probs": TensorFact(_FP32, (-1,)),
    "output_log_probs": TensorFact(_FP32, (-1, -1)),
    "context_logits": TensorFact(None, (-1, -1)),
    "generation_logits": TensorFact(None, (-1, -1, -1)),
    "batch_index": TensorFact(_I32, (1,)),
    "sequence_index": TensorFact(_I32, (1,)),
    "context_phase_params": TensorFact(_U8, (-1,)),
    "kv_cache_alloc_new_blocks": TensorFact(_I32, (1,)),
    "kv_cache_reused_blocks": TensorFact(_I32, (1,)),
    "kv_cache_alloc_total_blocks": TensorFact(_I32, (1,)),
    "arrival_time_ns": TensorFact(_I64, (1,)),
    "first_scheduled_time_ns": TensorFact(_I64, (1,)),
    "first_token_time_ns": TensorFact(_I64, (1,)),
    "last_token_time_ns": TensorFact(_I64, (1,)),
    "acceptance_rate": TensorFact(_FP32, (1,)),
    "total_accepted_draft_tokens": TensorFact(_I32, (1,)),
    "total_draft_tokens": TensorFact(_I32, (1,)),
    "num_input_tokens": TensorFact(_I32, (1,)),
    "num_output_tokens": TensorFact(_I32, (1,)),
}

TRTLLM_PARAMETERS: Final[frozenset[str]] = frozenset({
    "max_beam_width",
    "FORCE_CPU_ONLY_INPUT_TENSORS",
    "gpt_model_type",
    "gpt_model_path",
    "encoder_model_path",
    "max_tokens_in_paged_kv_cache",
    "max_attention_window_size",
    "sink_token_length",
    "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction",
    "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "enable_trt_overlap",
    "exclude_input_in_output",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "enable_kv_cache_reuse",
    "normalize_log_probs",
    "enable_chunked_context",
    "gpu_device_ids",
    "participant_ids",
    "num_nodes",
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "lora_prefetch_dir",
    "decoding_mode",
    "executor_worker_path",
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
    "medusa_choices",
    "eagle_choices",
    "gpu_weights_percent",
    "enable_context_fmha_fp32_acc",
    "multi_block_mode",
    "cuda_graph_mode",
    "cuda_graph_cache_size",
    "speculative_decoding_fast_logits",
    "tokenizer_dir",
    "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
})

# Placeholder names of the template (``${engine_dir}`` fills ``gpt_model_path``): not keys.
TRTLLM_PLACEHOLDERS: Final[dict[str, str]] = {
    "engine_dir": "gpt_model_path",
    "encoder_engine_dir": "encoder_model_path",
    "batching_strategy": "gpt_model_type",
}

# Values the backend accepts (from the backend's documentation of these keys).
BATCHING_STRATEGIES: Final = ("inflight_fused_batching", "inflight_batching", "V1")
DECODING_MODES: Final = (
    "top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle",
)

# Keys the backend reads with no default (see the module docstring): the model does not load
# without them.
TRTLLM_ALWAYS_READ: Final = ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path")
# guided_decoding_backend values the C++ backend accepts (any other non-empty one throws).
GUIDED_DECODING_BACKENDS: Final = ("xgrammar",)
# TensorRT-LLM's own writer of the tokenizer-info file, under its examples folder, and the
# name it gives the file inside --output_dir.
XGRAMMAR_TOKENIZER_INFO_SCRIPT: Final = "generate_xgrammar_tokenizer_info.py"
XGRAMMAR_TOKENIZER_INFO_FILE: Final = "xgrammar_tokenizer_info.json"
