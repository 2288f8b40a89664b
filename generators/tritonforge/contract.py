"""The one definition of every tensor, dtype, default and limit in a tritonforge deployment.

Everything that speaks to or inside a generated model repository imports this module: the
templates get their tensor lists from it, the Python models (preprocessing, the CPU engine,
postprocessing) read and write the names defined here, and the clients build requests with
them and validate against the same limits the server enforces.

Three contracts are defined:

* ``ENSEMBLE_INPUTS`` / ``ENSEMBLE_OUTPUTS`` -- what a client sends to and receives from the
  served model (the ensemble, or the BLS model).  Names follow NVIDIA's reference
  TensorRT-LLM ensemble, so existing clients work unchanged, and they are the SAME whichever
  engine serves the model.
* ``ENGINE_INPUTS`` / ``ENGINE_OUTPUTS`` -- the token-level contract of the TensorRT-LLM C++
  backend (``backend: "tensorrtllm"``).  tritonforge's CPU engine model (vLLM) speaks it too,
  so the same ensemble runs with either engine.
* ``PREPROCESSING_*`` / ``POSTPROCESSING_*`` -- tritonforge's own Python models between the
  two.

Every tensor's ``dims`` exclude the batch dimension: all models of a tritonforge repository
have ``max_batch_size > 0`` (the TensorRT-LLM backend requires it), so clients send shape
``[1, *dims]``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "CONDITIONAL_ENGINE_INPUTS",
    "ENABLE_EMPTY_FINAL_PARAMETER",
    "ENGINE_EXTRA_OUTPUTS",
    "ENGINE_INPUTS",
    "ENGINE_OUTPUTS",
    "ENSEMBLE_INPUTS",
    "ENSEMBLE_OUTPUTS",
    "ENSEMBLE_TO_ENGINE_RENAMES",
    "FINAL_RESPONSE_PARAMETER",
    "LIMITS",
    "MODEL_BLS",
    "MODEL_POSTPROCESSING",
    "MODEL_PREPROCESSING",
    "MODEL_TENSORRT_LLM",
    "MODEL_VLLM_ENGINE",
    "POSTPROCESSING_INPUTS",
    "POSTPROCESSING_OUTPUTS",
    "POSTPROCESSING_SOURCES",
    "PREPROCESSED_ENGINE_INPUTS",
    "PREPROCESSING_INPUTS",
    "PREPROCESSING_OUTPUTS",
    "DType",
    "FinishReason",
    "Limits",
    "Param",
    "SamplingDefaults",
    "Tensor",
    "by_name",
    "check_sampling",
    "parse_messages",
    "pre_output",
]


class DType(str, enum.Enum):
    """Triton data types used by the contract (``config.pbtxt`` spelling as the value)."""

    BOOL = "TYPE_BOOL"
    INT32 = "TYPE_INT32"
    INT64 = "TYPE_INT64"
    UINT64 = "TYPE_UINT64"
    FP16 = "TYPE_FP16"
    FP32 = "TYPE_FP32"
    STRING = "TYPE_STRING"

    @property
    def wire(self) -> str:
        """The datatype name on the wire (KServe v2 protocol): ``BYTES`` for strings."""
        return _WIRE[self]

    @property
    def numpy(self) -> str:
        """The numpy dtype string for this type (``object`` for strings)."""
        return _NUMPY[self]


_WIRE: Final = {
    DType.BOOL: "BOOL",
    DType.INT32: "INT32",
    DType.INT64: "INT64",
    DType.UINT64: "UINT64",
    DType.FP16: "FP16",
    DType.FP32: "FP32",
    DType.STRING: "BYTES",
}
_NUMPY: Final = {
    DType.BOOL: "bool",
    DType.INT32: "int32",
    DType.INT64: "int64",
    DType.UINT64: "uint64",
    DType.FP16: "float16",
    DType.FP32: "float32",
    DType.STRING: "object",
}


@dataclass(frozen=True)
class Tensor:
    """One input or output of a model: name, type, shape without the batch dim, doc."""

    name: str
    dtype: DType
    dims: tuple[int, ...]
    optional: bool = False
    doc: str = ""

    def renamed(self, name: str, *, optional: bool | None = None) -> Tensor:
        return Tensor(
            name, self.dtype, self.dims, self.optional if optional is None else optional, self.doc
        )


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {t.name: t for t in tensors}


# ----------------------------------------------------------------------------------------
# Model names inside a generated repository (the ensemble itself is named by the spec).
MODEL_PREPROCESSING: Final = "preprocessing"
MODEL_POSTPROCESSING: Final = "postprocessing"
MODEL_TENSORRT_LLM: Final = "tensorrt_llm"
MODEL_VLLM_ENGINE: Final = "vllm_engine"
MODEL_BLS: Final = "tensorrt_llm_bls"

# Parameters of decoupled gRPC streaming (Triton's own names).
FINAL_RESPONSE_PARAMETER: Final = "triton_final_response"
ENABLE_EMPTY_FINAL_PARAMETER: Final = "triton_enable_empty_final_response"


class FinishReason(str, enum.Enum):
    """Why a generation ended; carried in the ``finish_reason`` output of the last response."""

    NONE = ""  # not finished yet (intermediate streamed response)
    STOP = "stop"  # end_id / EOS or a stop word
    LENGTH = "length"  # max_tokens (or the context) reached
    CANCELLED = "cancelled"  # the client cancelled the request


# ----------------------------------------------------------------------------------------
# Limits shared by the server-side validation (preprocessing, engine) and the clients.
@dataclass(frozen=True)
class Limits:
    """Hard bounds every request is checked against, on the client and on the server."""

    max_tokens_min: int = 1
    max_tokens_max: int = 1_048_576
    temperature_min: float = 0.0
    temperature_max: float = 10.0
    top_p_min_exclusive: float = 0.0
    top_p_max: float = 1.0
    top_k_min: int = 0  # 0 disables top-k (TensorRT-LLM semantics)
    top_k_max: int = 1_000_000
    penalty_min: float = -2.0  # presence / frequency
    penalty_max: float = 2.0
    repetition_penalty_min_exclusive: float = 0.0
    repetition_penalty_max: float = 10.0
    min_tokens_min: int = 0
    beam_width_min: int = 1
    beam_width_max: int = 64
    max_prompt_bytes: int = 1_048_576  # 1 MiB of UTF-8
    max_stop_words: int = 32
    max_word_bytes: int = 1024
    max_messages: int = 1024
    message_roles: tuple[str, ...] = ("system", "user", "assistant", "tool")


LIMITS: Final = Limits()


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults applied when a request omits a sampling input (the spec may override them)."""

    max_tokens: int = 128
    temperature: float = 0.0  # greedy: the reproducible default
    top_p: float = 1.0
    top_k: int = 0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    length_penalty: float = 1.0
    beam_width: int = 1
    stream: bool = True
    exclude_input_in_output: bool = True


# ----------------------------------------------------------------------------------------
# The user-facing contract (ensemble / BLS). Reference TensorRT-LLM ensemble names.
ENSEMBLE_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("text_input", DType.STRING, (1,), True, "Prompt text (UTF-8). One of text_input / messages."),
    Tensor("messages", DType.STRING, (1,), True,
           'Chat messages as JSON: [{"role": "user", "content": "..."}]; the chat template is applied.'),
    Tensor("max_tokens", DType.INT32, (1,), True, "Maximum number of tokens to generate."),
    Tensor("bad_words", DType.STRING, (-1,), True, "Words the model must not generate."),
    Tensor("stop_words", DType.STRING, (-1,), True, "Generation stops after any of these words (not returned)."),
    Tensor("end_id", DType.INT32, (1,), True, "End-of-sequence token id (default: the tokenizer's)."),
    Tensor("pad_id", DType.INT32, (1,), True, "Padding token id (default: the tokenizer's)."),
    Tensor("top_k", DType.INT32, (1,), True, "Top-k sampling; 0 disables."),
    Tensor("top_p", DType.FP32, (1,), True, "Nucleus sampling probability mass, in (0, 1]."),
    Tensor("temperature", DType.FP32, (1,), True, "Sampling temperature; 0 is greedy."),
    Tensor("length_penalty", DType.FP32, (1,), True, "Beam-search length penalty."),
    Tensor("repetition_penalty", DType.FP32, (1,), True, "Multiplicative repetition penalty; 1 disables."),
    Tensor("presence_penalty", DType.FP32, (1,), True, "Additive presence penalty in [-2, 2]."),
    Tensor("frequency_penalty", DType.FP32, (1,), True, "Additive frequency penalty in [-2, 2]."),
    Tensor("min_tokens", DType.INT32, (1,), True, "Minimum number of tokens before EOS is allowed."),
    Tensor("seed", DType.UINT64, (1,), True, "Random seed for sampling."),
    Tensor("beam_width", DType.INT32, (1,), True, "Beam width; 1 (the default) disables beam search."),
    Tensor("stream", DType.BOOL, (1,), True, "Stream tokens as they are generated (decoupled models)."),
    Tensor("exclude_input_in_output", DType.BOOL, (1,), True, "Do not echo the prompt (default true)."),
    Tensor("lora_name", DType.STRING, (1,), True, "Name of a LoRA adapter from the spec."),
)

ENSEMBLE_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("text_output", DType.STRING, (-1,), False,
           "Generated text of this response: the delta when streaming, all of it otherwise."),
    Tensor("finish_reason", DType.STRING, (1,), False,
           'Empty while streaming; "stop", "length" or "cancelled" on the last response.'),
    Tensor("num_input_tokens", DType.INT32, (1,), False, "Prompt length in tokens."),
    Tensor("num_output_tokens", DType.INT32, (1,), False, "Tokens carried by this response."),
)

# ----------------------------------------------------------------------------------------
# The engine contract: NVIDIA's tensorrt_llm backend (inflight_batcher_llm) model.
ENGINE_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("input_ids", DType.INT32, (-1,), False, "Prompt token ids."),
    Tensor("input_lengths", DType.INT32, (1,), False, "Number of prompt tokens."),
    Tensor("request_output_len", DType.INT32, (1,), False, "Maximum number of tokens to generate."),
    Tensor("end_id", DType.INT32, (1,), True),
    Tensor("pad_id", DType.INT32, (1,), True),
    Tensor("runtime_top_k", DType.INT32, (1,), True),
    Tensor("runtime_top_p", DType.FP32, (1,), True),
    Tensor("temperature", DType.FP32, (1,), True),
    Tensor("len_penalty", DType.FP32, (1,), True),
    Tensor("repetition_penalty", DType.FP32, (1,), True),
    Tensor("presence_penalty", DType.FP32, (1,), True),
    Tensor("frequency_penalty", DType.FP32, (1,), True),
    Tensor("min_tokens", DType.INT32, (1,), True),
    Tensor("seed", DType.UINT64, (1,), True),
    Tensor("beam_width", DType.INT32, (1,), True),
    Tensor("streaming", DType.BOOL, (1,), True),
    Tensor("exclude_input_in_output", DType.BOOL, (1,), True),
    Tensor("return_log_probs", DType.BOOL, (1,), True),
    Tensor("stop", DType.BOOL, (1,), True),
    Tensor("stop_words_list", DType.INT32, (2, -1), True),
    Tensor("bad_words_list", DType.INT32, (2, -1), True),
    Tensor("embedding_bias", DType.FP32, (-1,), True),
    Tensor("lora_task_id", DType.UINT64, (1,), True),
)

ENGINE_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("output_ids", DType.INT32, (-1, -1), False, "Generated ids, beam x tokens."),
    Tensor("sequence_length", DType.INT32, (-1,), False, "Tokens per beam in output_ids."),
    Tensor("cum_log_probs", DType.FP32, (-1,), False),
    Tensor("output_log_probs", DType.FP32, (-1, -1), False),
)

# tritonforge's CPU engine adds outputs the C++ backend lacks. Triton ensembles refuse a step
# (or the ensemble's outputs) fed both by a decoupled model and by tensors from before it
# (server issue 7275), so postprocessing can only read what the engine returns: these carry
# what it needs. With the C++ backend they are absent and postprocessing infers the finish
# reason from end_id and reports num_input_tokens as -1 (unknown).
ENGINE_EXTRA_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("finish_reason", DType.STRING, (1,), False, "Set on the last response."),
    Tensor("num_input_tokens", DType.INT32, (1,), False, "Prompt length in tokens."),
)

# Ensemble name -> engine name, where the two differ (the reference ensemble's renames).
ENSEMBLE_TO_ENGINE_RENAMES: Final[dict[str, str]] = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
    "stream": "streaming",
}

# ----------------------------------------------------------------------------------------
# tritonforge's preprocessing and postprocessing models.
# Preprocessing receives every ensemble input, validates the whole request in one place
# (INVALID_ARG with a message naming the input), fills the spec's defaults, and hands the
# engine a complete set of engine inputs: output ``out_<engine input>`` feeds engine input
# ``<engine input>``. So both engines see the same, already-checked values.
PREPROCESSING_INPUTS: Final[tuple[Tensor, ...]] = ENSEMBLE_INPUTS

PREPROCESSED_ENGINE_INPUTS: Final[tuple[str, ...]] = (
    "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "runtime_top_k",
    "runtime_top_p", "temperature", "len_penalty", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "min_tokens", "seed", "beam_width", "streaming",
    "exclude_input_in_output", "stop_words_list", "bad_words_list", "lora_task_id",
)
# Engine inputs preprocessing produces but the ensemble maps only when the spec enables them.
CONDITIONAL_ENGINE_INPUTS: Final[dict[str, str]] = {"lora_task_id": "lora.enabled"}
PRE_OUTPUT_PREFIX: Final = "out_"


def pre_output(engine_input: str) -> str:
    """Name of the preprocessing output that feeds ``engine_input``."""
    return PRE_OUTPUT_PREFIX + engine_input


_ENGINE_IN = {t.name: t for t in ENGINE_INPUTS}
PREPROCESSING_OUTPUTS: Final[tuple[Tensor, ...]] = tuple(
    _ENGINE_IN[n].renamed(pre_output(n), optional=False) for n in PREPROCESSED_ENGINE_INPUTS
)

POSTPROCESSING_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("output_ids", DType.INT32, (-1, -1)),
    Tensor("sequence_length", DType.INT32, (-1,)),
    Tensor("engine_finish_reason", DType.STRING, (1,), True),
    Tensor("engine_num_input_tokens", DType.INT32, (1,), True),
)
POSTPROCESSING_OUTPUTS: Final[tuple[Tensor, ...]] = ENSEMBLE_OUTPUTS

# Where each postprocessing input comes from: the engine step only (see
# ENGINE_EXTRA_OUTPUTS). Optional sources are mapped only when the engine declares them.
# Detokenization state is keyed by the request id, which ensembles pass on to every step.
POSTPROCESSING_SOURCES: Final[dict[str, tuple[str, str]]] = {
    "output_ids": ("engine", "output_ids"),
    "sequence_length": ("engine", "sequence_length"),
    "engine_finish_reason": ("engine", "finish_reason"),
    "engine_num_input_tokens": ("engine", "num_input_tokens"),
}


class Param(str, enum.Enum):
    """Keys of the ``parameters`` the generator writes for tritonforge's Python models.

    Values are strings in config.pbtxt (JSON where structured); the models read them back
    with the same keys.
    """

    MODEL = "tritonforge_model"  # model reference: "package:<name>" or a folder path
    TOKENIZER = "tritonforge_tokenizer"  # tokenizer folder/reference; defaults to MODEL
    CHAT_TEMPLATE = "tritonforge_chat_template"  # "messages" | "always"
    SAMPLING_DEFAULTS = "tritonforge_sampling_defaults"  # JSON of SamplingDefaults fields
    DEFAULT_STOP_WORDS = "tritonforge_default_stop_words"  # JSON list of strings
    MAX_MODEL_LEN = "tritonforge_max_model_len"  # context length in tokens
    MAX_PROMPT_BYTES = "tritonforge_max_prompt_bytes"
    LORA_ADAPTERS = "tritonforge_lora_adapters"  # JSON {name: {"id": int, "path": str}}
    ENGINE_ARGS = "tritonforge_engine_args"  # JSON of vLLM AsyncEngineArgs
    SKIP_SPECIAL_TOKENS = "tritonforge_skip_special_tokens"  # "true" | "false"
    TARGET_MODEL = "tritonforge_target_model"  # BLS / sync model: the model it calls
    ENGINE_ENV = "tritonforge_engine_env"  # JSON {VAR: value} set before importing the engine


def parse_messages(raw: str, limits: Limits = LIMITS) -> list[dict[str, str]]:
    """Parse and check the ``messages`` JSON input; raise ``ValueError`` naming the problem.

    Shared by the preprocessing model and the clients so both accept exactly the same input.
    """
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"messages must be a JSON list of {{role, content}} objects: {exc}") from None
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty JSON list of {role, content} objects")
    if len(value) > limits.max_messages:
        raise ValueError(f"messages has {len(value)} entries; at most {limits.max_messages} are allowed")
    out: list[dict[str, str]] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if role not in limits.message_roles:
            raise ValueError(
                f"messages[{i}].role must be one of {', '.join(limits.message_roles)}; got {role!r}"
            )
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        extra = set(msg) - {"role", "content", "name"}
        if extra:
            raise ValueError(f"messages[{i}] has unknown keys: {', '.join(sorted(extra))}")
        out.append({"role": role, "content": content})
    return out


def check_sampling(values: dict[str, Any], limits: Limits = LIMITS) -> None:
    """Check the scalar sampling inputs of one request; raise ``ValueError`` naming the first bad one.

    ``values`` maps ensemble input names to Python scalars; absent names are not checked.
    The preprocessing model and the clients both call this, so they agree on every bound.
    """

    def bad(name: str, allowed: str) -> ValueError:
        return ValueError(f"{name} must be {allowed}; got {values[name]!r}")

    def num(name: str) -> float | None:
        v = values.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(name, "a number")
        if v != v or v in (float("inf"), float("-inf")):
            raise bad(name, "a finite number")
        return float(v)

    if (v := num("max_tokens")) is not None and not (limits.max_tokens_min <= v <= limits.max_tokens_max):
        raise bad("max_tokens", f"an integer in [{limits.max_tokens_min}, {limits.max_tokens_max}]")
    if (v := num("temperature")) is not None and not (limits.temperature_min <= v <= limits.temperature_max):
        raise bad("temperature", f"in [{limits.temperature_min}, {limits.temperature_max}]")
    if (v := num("top_p")) is not None and not (limits.top_p_min_exclusive < v <= limits.top_p_max):
        raise bad("top_p", f"in ({limits.top_p_min_exclusive}, {limits.top_p_max}]")
    if (v := num("top_k")) is not None and not (limits.top_k_min <= v <= limits.top_k_max):
        raise bad("top_k", f"an integer in [{limits.top_k_min}, {limits.top_k_max}] (0 disables it)")
    for name in ("presence_penalty", "frequency_penalty"):
        if (v := num(name)) is not None and not (limits.penalty_min <= v <= limits.penalty_max):
            raise bad(name, f"in [{limits.penalty_min}, {limits.penalty_max}]")
    if (v := num("repetition_penalty")) is not None and not (
        limits.repetition_penalty_min_exclusive < v <= limits.repetition_penalty_max
    ):
        raise bad("repetition_penalty",
                  f"in ({limits.repetition_penalty_min_exclusive}, {limits.repetition_penalty_max}]")
    num("length_penalty")
    if (v := num("min_tokens")) is not None:
        if v < limits.min_tokens_min:
            raise bad("min_tokens", f">= {limits.min_tokens_min}")
        mt = values.get("max_tokens")
        if isinstance(mt, (int, float)) and not isinstance(mt, bool) and v > mt:
            raise bad("min_tokens", f"<= max_tokens ({mt})")
    if (v := num("beam_width")) is not None and not (limits.beam_width_min <= v <= limits.beam_width_max):
        raise bad("beam_width", f"an integer in [{limits.beam_width_min}, {limits.beam_width_max}]")
    if (v := num("seed")) is not None and not (0 <= v < 2**64):
        raise bad("seed", "an unsigned 64-bit integer")
    for name in ("stop_words", "bad_words"):
        words = values.get(name)
        if words is None:
            continue
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
            raise bad(name, "a list of strings")
        if len(words) > limits.max_stop_words:
            raise bad(name, f"at most {limits.max_stop_words} words")
        for w in words:
            if not w:
                raise ValueError(f"{name} must not contain an empty word")
            if len(w.encode("utf-8")) > limits.max_word_bytes:
                raise ValueError(f"{name}: each word must be at most {limits.max_word_bytes} bytes")
