"""The one definition of every tensor, request parameter, default, limit and error kind.

Everything that speaks to or inside a generated model repository imports this module: the
renderer gets its tensor lists and ensemble wiring from it, the Python models inside
tritonserver read and write the names defined here, the typed clients, the OpenAI gateway
and the load tests build requests from it, and ``docs/requests.md`` is generated from it.

The heart of it is :data:`REQUEST_PARAMETERS`, one row per request parameter: its ensemble
input name, the engine input it feeds, dtype and shape, default, bounds, OpenAI name, typed
client field and doc line. Everything else about a parameter is derived from that row:

* ``ENSEMBLE_INPUTS`` (what a client sends) and the request-parameter part of
  ``ENGINE_INPUTS`` (the token-level contract of the TensorRT-LLM C++ backend, which
  tritonforge's own engine model speaks too, so one ensemble runs on either engine);
* ``PREPROCESSING_OUTPUTS`` and the ensemble's wiring (``pre_output``);
* the spec's ``defaults`` section (``SAMPLING_DEFAULTS`` and the rows' docs);
* the validation preprocessing runs once per request (:func:`check_request_values`);
* the typed client's ``Request`` fields (asserted equal at import), the gateway's mapping of
  OpenAI fields, and the reference table in ``docs/requests.md``.

Adding a sampling parameter is one row here plus its line in each engine adapter's mapping
(``tritonforge.triton_models.engine``).

Errors: every error a tritonforge model returns carries an :class:`ErrorKind` (and the
request parameter at fault, if any) in a machine-readable tag, written by
:func:`format_error` and read back by :func:`parse_error`; clients, the gateway and the load
test classify errors by that tag, never by their prose.

Every tensor's ``dims`` exclude the batch dimension: all models of a tritonforge repository
have ``max_batch_size > 0`` (the TensorRT-LLM backend requires it), so clients send shape
``[1, *dims]``.
"""

from __future__ import annotations

import difflib
import enum
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "BACKEND_FAILURE_TEXTS",
    "CANCEL_DIR_ENV",
    "DRAIN_FILE_ENV",
    "ENABLE_EMPTY_FINAL_PARAMETER",
    "ENGINE_EXTRA_OUTPUTS",
    "ENGINE_INPUTS",
    "ENGINE_KINDS",
    "ENGINE_OUTPUTS",
    "ENSEMBLE_INPUTS",
    "ENSEMBLE_OUTPUTS",
    "FINAL_RESPONSE_PARAMETER",
    "FRONT_KEY_PARAMETER",
    "FRONT_KEY_PATTERN",
    "GUIDES",
    "GUIDE_INPUT",
    "GUIDE_TYPE_INPUT",
    "LIMITS",
    "LORA_CONFIG_FILE",
    "LORA_ENGINE_INPUTS",
    "LORA_WEIGHTS_FILE",
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
    "REQUEST_PARAMETERS",
    "RESTART_FILE_ENV",
    "SAMPLING_DEFAULTS",
    "STOP_REQUEST",
    "TRITON_REQUEST_PARAMETERS",
    "TRTLLM_GUIDE_TYPES",
    "DType",
    "EngineKind",
    "ErrorInfo",
    "ErrorKind",
    "FinishReason",
    "Guide",
    "GuideType",
    "Limits",
    "Param",
    "ParameterError",
    "RequestParam",
    "Tensor",
    "by_name",
    "check_guide",
    "check_request_parameters",
    "check_request_values",
    "closest",
    "encode_guide",
    "engine_inputs_for",
    "engine_request_id",
    "format_error",
    "is_stop_request",
    "param",
    "parse_error",
    "parse_messages",
    "pre_output",
    "requests_markdown",
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
        return "BYTES" if self is DType.STRING else self.value.removeprefix("TYPE_")

    @property
    def is_integer(self) -> bool:
        return self in (DType.INT32, DType.INT64, DType.UINT64)

    @property
    def numpy(self) -> str:
        """The numpy dtype name of this type (``object`` for strings)."""
        return "object" if self is DType.STRING else self.value.removeprefix("TYPE_").lower().replace("fp", "float")


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


def by_name(tensors: Iterable[Tensor]) -> dict[str, Tensor]:
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


class EngineKind(str, enum.Enum):
    """Which engine serves the engine step (preprocessing refuses what it cannot do)."""

    VLLM = "vllm"  # tritonforge's engine model over vLLM's AsyncLLM
    TRTLLM_CPP = "trtllm_cpp"  # NVIDIA's tensorrtllm C++ backend
    TRTLLM_LLMAPI = "trtllm_llmapi"  # tritonforge's engine model over tensorrt_llm.LLM


ENGINE_KINDS: Final = tuple(EngineKind)


class FinishReason(str, enum.Enum):
    """Why a generation ended; carried in the ``finish_reason`` output of the last response."""

    NONE = ""  # not finished yet (intermediate streamed response)
    STOP = "stop"  # end_id / EOS or a stop word
    LENGTH = "length"  # max_tokens (or the context) reached
    CANCELLED = "cancelled"  # the client cancelled the request
    ERROR = "error"  # engine-internal: failed after streaming; its ``error`` output says why


# ----------------------------------------------------------------------------------------
# Errors: one vocabulary, one writer, one reader.
class ErrorKind(str, enum.Enum):
    """What went wrong, as every tritonforge model reports it (the value is the wire tag)."""

    INVALID_REQUEST = "invalid_request"  # the request is wrong; fix it and resend
    OVERLOADED = "overloaded"  # the server is at capacity (queue full); retry later
    CANCELLED = "cancelled"  # the request was cancelled before it finished
    NOT_READY = "not_ready"  # the model (or its engine) is not ready to serve
    ENGINE_FAILURE = "engine_failure"  # the inference engine failed on a valid request
    INTERNAL = "internal"  # another tritonforge step failed on a valid request

    @property
    def triton_code(self) -> str:
        """The ``TritonError`` code name the Python backend answers this kind with."""
        return _TRITON_CODES[self]


_TRITON_CODES: Final = {
    ErrorKind.INVALID_REQUEST: "INVALID_ARG",
    ErrorKind.OVERLOADED: "UNAVAILABLE",
    ErrorKind.CANCELLED: "CANCELLED",
    ErrorKind.NOT_READY: "UNAVAILABLE",
    ErrorKind.ENGINE_FAILURE: "INTERNAL",
    ErrorKind.INTERNAL: "INTERNAL",
}


@dataclass(frozen=True)
class ErrorInfo:
    """An error as :func:`parse_error` reads it back."""

    kind: ErrorKind
    message: str  # the prose, without the tag (and without Triton's ensemble prefix)
    param: str | None = None  # the request parameter at fault, when there is one


_ERROR_TAG: Final = "tritonforge"
_ERROR_RE: Final = re.compile(r"\[" + _ERROR_TAG + r":(?P<kind>[a-z_]+)(?::(?P<param>[A-Za-z0-9_.\[\]-]+))?\] ?")


def format_error(kind: ErrorKind, message: str, param: str | None = None) -> str:
    """The message of an error a tritonforge model returns: a tag, then the prose.

    ``[tritonforge:invalid_request:top_p] top_p must be in (0, 1]; got 2.0``
    """
    tag = f"[{_ERROR_TAG}:{kind.value}" + (f":{param}" if param else "") + "]"
    return f"{tag} {message}"


# Errors Triton's Python backend (2.51) itself answers when a model's stub process fails or
# misses its health deadline (python_backend ``stub_launcher.cc``, ``python_be.cc``): the
# server failed on a valid request. They carry no tritonforge tag, and inside a stream they
# arrive without a status code, so they are recognised by these texts.
BACKEND_FAILURE_TEXTS: Final = (
    "is not healthy",  # "Stub process '<instance>' is not healthy."
    "Failed to obtain the health mutex",
    "Failed to process the request(s) for model instance",
)


def parse_error(text: str) -> ErrorInfo | None:
    """Read the tag :func:`format_error` wrote; ``None`` for an error without one (Triton's
    own errors: use the transport's status code for those), except the Python backend's own
    failures (:data:`BACKEND_FAILURE_TEXTS`), which are ``INTERNAL``."""
    m = _ERROR_RE.search(text)
    if m is None:
        if any(marker in text for marker in BACKEND_FAILURE_TEXTS):
            return ErrorInfo(ErrorKind.INTERNAL, text.strip())
        return None
    try:
        kind = ErrorKind(m.group("kind"))
    except ValueError:
        return None
    return ErrorInfo(kind, text[m.end():].strip() or kind.value, m.group("param"))


# ----------------------------------------------------------------------------------------
# Limits that are not a parameter's bounds (those live in the parameter table).
@dataclass(frozen=True)
class Limits:
    """Hard bounds on a request's size, on the client and on the server."""

    max_prompt_bytes: int = 1_048_576  # 1 MiB of UTF-8
    max_stop_words: int = 32
    max_word_bytes: int = 1024
    max_messages: int = 1024
    max_guide_bytes: int = 262_144  # guided_decoding_guide (a JSON schema, a grammar, ...)
    message_roles: tuple[str, ...] = ("system", "user", "assistant", "tool")


LIMITS: Final = Limits()


# ----------------------------------------------------------------------------------------
# THE request-parameter table.
ParamKind = Literal["prompt", "scalar", "words", "adapter", "text"]
_ALL_ENGINES: Final = frozenset(EngineKind)


@dataclass(frozen=True)
class RequestParam:
    """One request parameter, everything about it in one row.

    ``kind`` says how preprocessing turns it into engine inputs: ``prompt`` (text_input /
    messages -> ``input_ids``), ``scalar`` (passed on, default filled), ``words`` (strings ->
    TensorRT-LLM's ``[2, L]`` token-id word list), ``adapter`` (a LoRA adapter name -> its
    task id), ``text`` (one UTF-8 string passed on, e.g. a structured-output guide).
    ``low``/``high`` are inclusive unless ``low_open``/``high_open``.
    """

    name: str  # ensemble input name (reference TensorRT-LLM ensemble names)
    dtype: DType
    doc: str
    kind: ParamKind = "scalar"
    dims: tuple[int, ...] = (1,)
    engine: str | None = None  # engine input it feeds; None: same as ``name``
    engine_dtype: DType | None = None  # when the engine tensor differs (words, adapter)
    engine_dims: tuple[int, ...] | None = None
    default: Any = None  # None: no default (the engine or tokenizer decides)
    spec_default: bool = False  # the spec's ``defaults`` section may override ``default``
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    openai: str | None = None  # OpenAI request field the gateway maps to it
    client: str | None = None  # typed client ``Request`` field
    engines: frozenset[EngineKind] = _ALL_ENGINES  # engines that honour it
    requires: str | None = None  # spec feature that must be on for the engine to receive it
    why_unsupported: str = ""  # said to a client that sets it on another engine

    @property
    def engine_name(self) -> str | None:
        """The engine input fed by this parameter (``None`` for the prompt)."""
        if self.kind == "prompt":
            return None
        return self.engine or self.name

    @property
    def tensor(self) -> Tensor:
        return Tensor(self.name, self.dtype, self.dims, True, self.doc)

    @property
    def engine_tensor(self) -> Tensor | None:
        name = self.engine_name
        if name is None:
            return None
        return Tensor(name, self.engine_dtype or self.dtype, self.engine_dims or self.dims, True)

    @property
    def bounds_text(self) -> str:
        if self.low is None and self.high is None:
            return ""
        lo = "-inf" if self.low is None else _num_text(self.low)
        hi = "inf" if self.high is None else _num_text(self.high)
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        return f"{left}{lo}, {hi}{right}"


def _num_text(v: float) -> str:
    if isinstance(v, int) or (float(v).is_integer() and abs(v) < 1e15):
        return str(int(v))
    return repr(float(v))


_I32: Final = 2**31 - 1
_VLLM_ONLY: Final = frozenset({EngineKind.VLLM, EngineKind.TRTLLM_LLMAPI})
# Engines that return each token's most likely alternatives (vLLM's logprobs=k; the LLM API's
# SamplingParams.logprobs=k, CompletionOutput.logprobs: {token: Logprob} per position).
_TOP_LOGPROBS: Final = frozenset({EngineKind.VLLM, EngineKind.TRTLLM_LLMAPI})

REQUEST_PARAMETERS: Final[tuple[RequestParam, ...]] = (
    RequestParam("text_input", DType.STRING, "Prompt text (UTF-8). One of text_input / messages.",
                 kind="prompt", openai="prompt", client="prompt"),
    RequestParam("messages", DType.STRING,
                 'Chat messages as JSON: [{"role": "user", "content": "..."}]; the chat template is applied.',
                 kind="prompt", openai="messages", client="messages"),
    RequestParam("max_tokens", DType.INT32, "Maximum number of tokens to generate.",
                 engine="request_output_len", default=128, spec_default=True, low=1, high=1_048_576,
                 openai="max_tokens", client="max_tokens"),
    RequestParam("bad_words", DType.STRING, "Words the model must not generate.", kind="words",
                 dims=(-1,), engine="bad_words_list", engine_dtype=DType.INT32, engine_dims=(2, -1),
                 openai="bad_words", client="bad_words"),
    RequestParam("stop_words", DType.STRING, "Generation stops after any of these words (not returned).",
                 kind="words", dims=(-1,), engine="stop_words_list", engine_dtype=DType.INT32,
                 engine_dims=(2, -1), default=(), spec_default=True, openai="stop", client="stop"),
    RequestParam("end_id", DType.INT32, "End-of-sequence token id (default: the tokenizer's).",
                 low=0, high=_I32),
    RequestParam("pad_id", DType.INT32, "Padding token id (default: the tokenizer's).",
                 low=0, high=_I32),
    RequestParam("top_k", DType.INT32, "Top-k sampling; 0 disables.", engine="runtime_top_k",
                 default=0, spec_default=True, low=0, high=1_000_000, openai="top_k", client="top_k"),
    RequestParam("top_p", DType.FP32, "Nucleus sampling probability mass.", engine="runtime_top_p",
                 default=1.0, spec_default=True, low=0.0, high=1.0, low_open=True,
                 openai="top_p", client="top_p"),
    RequestParam("min_p", DType.FP32,
                 "Minimum token probability, relative to the most likely token's; 0 disables.",
                 default=0.0, spec_default=True, low=0.0, high=1.0, openai="min_p", client="min_p",
                 engines=_VLLM_ONLY,
                 why_unsupported="the TensorRT-LLM C++ backend has no min_p input"),
    RequestParam("temperature", DType.FP32, "Sampling temperature; 0 is greedy.", default=0.0,
                 spec_default=True, low=0.0, high=10.0, openai="temperature", client="temperature"),
    RequestParam("length_penalty", DType.FP32, "Beam-search length penalty.", engine="len_penalty",
                 default=1.0, spec_default=True, low=-10.0, high=10.0,
                 engines=frozenset({EngineKind.TRTLLM_CPP}),
                 why_unsupported="it applies to beam search, which this engine does not do"),
    RequestParam("repetition_penalty", DType.FP32, "Multiplicative repetition penalty; 1 disables.",
                 default=1.0, spec_default=True, low=0.0, high=10.0, low_open=True,
                 openai="repetition_penalty", client="repetition_penalty"),
    RequestParam("presence_penalty", DType.FP32, "Additive presence penalty.", default=0.0,
                 spec_default=True, low=-2.0, high=2.0, openai="presence_penalty",
                 client="presence_penalty"),
    RequestParam("frequency_penalty", DType.FP32, "Additive frequency penalty.", default=0.0,
                 spec_default=True, low=-2.0, high=2.0, openai="frequency_penalty",
                 client="frequency_penalty"),
    RequestParam("min_tokens", DType.INT32, "Minimum number of tokens before EOS is allowed.",
                 default=0, spec_default=True, low=0, high=1_048_576, openai="min_tokens",
                 client="min_tokens"),
    RequestParam("seed", DType.UINT64, "Random seed for sampling (default: a random one).",
                 low=0, high=2**64, high_open=True, openai="seed", client="seed"),
    RequestParam("beam_width", DType.INT32, "Beam width; 1 (the default) disables beam search.",
                 default=1, spec_default=True, low=1, high=64,
                 engines=frozenset({EngineKind.TRTLLM_CPP}),
                 why_unsupported="this engine does not beam-search"),
    RequestParam("stream", DType.BOOL, "Stream tokens as they are generated (decoupled models).",
                 engine="streaming", default=True, spec_default=True, openai="stream", client="stream"),
    RequestParam("exclude_input_in_output", DType.BOOL, "Do not echo the prompt (default true).",
                 default=True, spec_default=True),
    RequestParam("lora_name", DType.STRING, "Name of a LoRA adapter from the spec.", kind="adapter",
                 engine="lora_task_id", engine_dtype=DType.UINT64, requires="lora", client="lora"),
    RequestParam("num_return_sequences", DType.INT32,
                 "Independent sequences to generate for the prompt (OpenAI n); each response "
                 "carries its sequence_index. Streaming ensemble only.",
                 default=1, low=1, high=16, client="n"),
    RequestParam("return_log_probs", DType.BOOL,
                 "Return the log-probability of each generated token (output_log_probs).",
                 default=False, client="logprobs"),
    RequestParam("top_logprobs", DType.INT32,
                 "With return_log_probs: also this many most likely tokens at each position "
                 "(output_top_log_probs); 0: none.",
                 default=0, low=0, high=20, client="top_logprobs", engines=_TOP_LOGPROBS,
                 why_unsupported="the TensorRT-LLM C++ backend returns each generated token's own "
                                 "log-probability only (output_log_probs), no alternatives"),
    RequestParam("guided_decoding_guide_type", DType.STRING,
                 "Structured output: what guided_decoding_guide is -- json (any JSON object; no "
                 "guide), json_schema, regex, choice or ebnf_grammar; empty: unconstrained.",
                 kind="text", default=""),
    RequestParam("guided_decoding_guide", DType.STRING,
                 "The guide: a JSON schema, a regular expression (matched in full), a JSON list "
                 "of strings (choice) or an EBNF grammar with a root rule.",
                 kind="text", default=""),
)

_PARAMS: Final = {p.name: p for p in REQUEST_PARAMETERS}


def param(name: str) -> RequestParam:
    """The row of request parameter ``name`` (its ensemble input name)."""
    return _PARAMS[name]


# ----------------------------------------------------------------------------------------
# Structured outputs: the values of ``guided_decoding_guide_type`` and what each guide is.
class GuideType(str, enum.Enum):
    """What ``guided_decoding_guide`` holds: TensorRT-LLM's guide types (its engine contract's
    names), plus ``choice`` (vLLM's; the guide is a JSON list of strings).

    The TensorRT-LLM engines know only :data:`TRTLLM_GUIDE_TYPES` (the C++ backend ignores
    any other value: ``getGuidedDecodingParamsFromTensors`` in its ``utils.cc``), and build
    JSON with free whitespace; for them preprocessing lowers ``json``, ``json_schema`` and
    ``choice`` to an equivalent ``ebnf_grammar`` (compact JSON, as the vLLM engine writes it).
    """

    JSON = "json"  # any JSON object; no guide
    JSON_SCHEMA = "json_schema"  # a JSON schema (JSON text)
    REGEX = "regex"  # a regular expression the whole output matches
    CHOICE = "choice"  # a JSON list of strings: the output is exactly one of them
    EBNF_GRAMMAR = "ebnf_grammar"  # an EBNF grammar (GBNF style, with a ``root`` rule)


@dataclass(frozen=True)
class Guide:
    """One guide type: the typed client's ``Request`` field and the gateway's vLLM-style
    request field that ask for it."""

    type: GuideType
    client: str
    openai: str | None
    doc: str


GUIDES: Final[tuple[Guide, ...]] = (
    Guide(GuideType.JSON, "json_object", None,
          "true: any JSON object (OpenAI's response_format json_object)"),
    Guide(GuideType.JSON_SCHEMA, "json_schema", "guided_json", "a JSON schema (a dict, or its JSON text)"),
    Guide(GuideType.REGEX, "regex", "guided_regex", "a regular expression the whole output matches"),
    Guide(GuideType.CHOICE, "choice", "guided_choice", "a list of strings: the output is one of them"),
    Guide(GuideType.EBNF_GRAMMAR, "grammar", "guided_grammar", "an EBNF grammar with a root rule"),
)
# The guide types TensorRT-LLM's engines accept (GuidedDecodingParams::GuideType: kJSON,
# kJSON_SCHEMA, kREGEX, kEBNF_GRAMMAR, by the C++ backend's names).
TRTLLM_GUIDE_TYPES: Final = (GuideType.JSON, GuideType.JSON_SCHEMA, GuideType.REGEX, GuideType.EBNF_GRAMMAR)
GUIDE_TYPE_INPUT: Final = "guided_decoding_guide_type"
GUIDE_INPUT: Final = "guided_decoding_guide"


def encode_guide(guide: Guide, value: Any) -> dict[str, str]:
    """The two ensemble inputs that ask for ``value`` as ``guide`` (a schema dict and a
    choice list travel as JSON text; ``json_object`` takes ``True`` and sends no guide)."""
    if guide.type is GuideType.JSON:
        text = ""
    elif isinstance(value, str):
        text = value
    elif guide.type is GuideType.JSON_SCHEMA and isinstance(value, Mapping):
        text = json.dumps(dict(value), ensure_ascii=False)
    elif guide.type is GuideType.CHOICE and isinstance(value, (list, tuple)):
        text = json.dumps(list(value), ensure_ascii=False)
    else:
        raise ParameterError(f"{guide.client} must be {guide.doc}; got {value!r}", guide.client)
    return {GUIDE_TYPE_INPUT: guide.type.value, GUIDE_INPUT: text}


def check_guide(guide_type: str, guide: str, limits: Limits = LIMITS) -> Any:
    """Check a guide's structure (what any client can check; the server also compiles it):
    :class:`ParameterError` naming the input at fault. Returns the guide parsed -- the
    schema's dict, the choice list, or the text -- or ``None`` when there is no guide."""
    if not guide_type:
        if guide:
            raise ParameterError(f"{GUIDE_INPUT} needs {GUIDE_TYPE_INPUT} (one of "
                                 + ", ".join(t.value for t in GuideType) + ")", GUIDE_TYPE_INPUT)
        return None
    try:
        kind = GuideType(guide_type)
    except ValueError:
        raise ParameterError(f"{GUIDE_TYPE_INPUT} must be one of " + ", ".join(t.value for t in GuideType)
                             + f"; got {guide_type!r}", GUIDE_TYPE_INPUT) from None
    if len(guide.encode("utf-8")) > limits.max_guide_bytes:
        raise ParameterError(f"{GUIDE_INPUT} must be at most {limits.max_guide_bytes} bytes", GUIDE_INPUT)
    if "\x00" in guide:
        raise ParameterError(f"{GUIDE_INPUT} must not contain a NUL character", GUIDE_INPUT)
    if kind is GuideType.JSON:
        if guide:
            raise ParameterError(f"{GUIDE_TYPE_INPUT} json takes no {GUIDE_INPUT} (any JSON object); "
                                 "send json_schema to give a schema", GUIDE_INPUT)
        return None
    if not guide.strip():
        raise ParameterError(f"{GUIDE_INPUT} is empty; {kind.value} needs a guide", GUIDE_INPUT)
    if kind in (GuideType.JSON_SCHEMA, GuideType.CHOICE):
        try:
            value = json.loads(guide)
        except json.JSONDecodeError as exc:
            raise ParameterError(f"{GUIDE_INPUT} ({kind.value}) is not valid JSON: {exc}", GUIDE_INPUT) from None
        if kind is GuideType.JSON_SCHEMA and not isinstance(value, dict):
            raise ParameterError(f"{GUIDE_INPUT} (json_schema) must be a JSON object (a schema); "
                                 f"got {type(value).__name__}", GUIDE_INPUT)
        if kind is GuideType.CHOICE and (not isinstance(value, list) or not value
                                         or not all(isinstance(c, str) and c for c in value)):
            raise ParameterError(f"{GUIDE_INPUT} (choice) must be a JSON list of non-empty strings; "
                                 f"got {guide[:200]!r}", GUIDE_INPUT)
        return value
    return guide


# Defaults a request gets for what it omits; the spec's ``defaults`` section overrides them.
SAMPLING_DEFAULTS: Final[Mapping[str, Any]] = {
    p.name: p.default for p in REQUEST_PARAMETERS if p.spec_default
}


class ParameterError(ValueError):
    """A request parameter is wrong: the message starts with its name, ``param`` is it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name a misspelt ``name`` most likely meant, if any is close."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def _number(p: RequestParam, value: Any) -> None:
    what = "an integer" if p.dtype.is_integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{p.name} must be {what}; got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{p.name} must be a finite number; got {value!r}")
    if p.dtype.is_integer and not float(value).is_integer():
        raise ValueError(f"{p.name} must be an integer; got {value!r}")
    v = int(value) if p.dtype.is_integer else value  # exact for 64-bit integers
    lo_bad = p.low is not None and (v <= p.low if p.low_open else v < p.low)
    hi_bad = p.high is not None and (v >= p.high if p.high_open else v > p.high)
    if lo_bad or hi_bad:
        extra = " (0 disables it)" if p.name == "top_k" else ""
        raise ValueError(f"{p.name} must be {what} in {p.bounds_text}{extra}; got {value!r}")


def check_request_values(
    values: Mapping[str, Any], *, engine: EngineKind | None = None, limits: Limits = LIMITS
) -> None:
    """Check one request's parameters against the table; raise :class:`ParameterError`
    naming the first bad one.

    ``values`` maps ensemble input names to Python values (scalars; lists of strings for
    word lists); absent names are not checked. Preprocessing runs this on every request
    (with the engine it feeds, so what that engine cannot honour is refused rather than
    dropped), the typed clients before sending, the spec loader on the spec's defaults.
    """
    for name, value in values.items():
        p = _PARAMS.get(name)
        if p is None:
            known = [q.name for q in REQUEST_PARAMETERS]
            hint = closest(name, known)
            raise ParameterError(
                f"{name} is not a request parameter" + (f"; did you mean {hint}?" if hint else "")
                + f" (known: {', '.join(known)})", name)
        try:
            _check_one(p, value, limits)
        except ValueError as exc:
            raise ParameterError(str(exc), name) from None
        if engine is not None and engine not in p.engines and value != p.default:
            raise ParameterError(
                f"{name} is not supported by this deployment's engine ({engine.value}): "
                f"{p.why_unsupported}; leave it out", name)
    if GUIDE_TYPE_INPUT in values or GUIDE_INPUT in values:
        gt, g = values.get(GUIDE_TYPE_INPUT, ""), values.get(GUIDE_INPUT, "")
        if isinstance(gt, str) and isinstance(g, str):
            check_guide(gt, g, limits)
    mt, mn = values.get("max_tokens"), values.get("min_tokens")
    if isinstance(mt, int) and isinstance(mn, int) and mn > mt:
        raise ParameterError(f"min_tokens must be <= max_tokens ({mt}); got {mn}", "min_tokens")


def _check_one(p: RequestParam, value: Any, limits: Limits) -> None:
    if p.kind == "words":
        if not isinstance(value, (list, tuple)) or not all(isinstance(w, str) for w in value):
            raise ValueError(f"{p.name} must be a list of strings; got {value!r}")
        if len(value) > limits.max_stop_words:
            raise ValueError(f"{p.name} must have at most {limits.max_stop_words} words; got {len(value)}")
        for w in value:
            if not w:
                raise ValueError(f"{p.name} must not contain an empty word")
            if len(w.encode("utf-8")) > limits.max_word_bytes:
                raise ValueError(f"{p.name}: each word must be at most {limits.max_word_bytes} bytes")
    elif p.dtype is DType.BOOL:
        if not isinstance(value, bool):
            raise ValueError(f"{p.name} must be true or false; got {value!r}")
    elif p.dtype is DType.STRING:
        if not isinstance(value, str):
            raise ValueError(f"{p.name} must be a string; got {value!r}")
    else:
        _number(p, value)


# Request parameters Triton itself defines (not tritonforge's): allowed on every request.
# HTTP ``generate``/``generate_stream`` turn every JSON key that names no input into a
# request parameter (and "id" too), gRPC clients set them explicitly.
TRITON_REQUEST_PARAMETERS: Final = frozenset({
    "id", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
    "binary_data_output", "headers",
})


def check_request_parameters(parameters: Mapping[str, Any]) -> None:
    """Refuse request parameters nobody reads (a misspelt input such as ``temprature`` sent
    to ``generate_stream`` arrives as one): :class:`ParameterError` naming it and the
    closest input. Triton's own parameters (``triton_*``, sequence ids, priority) pass."""
    known_inputs = [p.name for p in REQUEST_PARAMETERS]
    for key in parameters:
        if key in TRITON_REQUEST_PARAMETERS or key.startswith("triton_") or key == FRONT_KEY_PARAMETER:
            continue
        hint = closest(key, known_inputs + sorted(TRITON_REQUEST_PARAMETERS))
        raise ParameterError(
            f"{key} is not an input of this model" + (f"; did you mean {hint}?" if hint else "")
            + " (inputs: " + ", ".join(known_inputs) + ")", key)


# ----------------------------------------------------------------------------------------
# The user-facing contract (ensemble / BLS / _sync). Reference TensorRT-LLM ensemble names.
ENSEMBLE_INPUTS: Final[tuple[Tensor, ...]] = tuple(p.tensor for p in REQUEST_PARAMETERS)

ENSEMBLE_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("text_output", DType.STRING, (-1,), False,
           "Generated text of this response: the delta when streaming, all of it otherwise."),
    Tensor("finish_reason", DType.STRING, (1,), False,
           '"stop", "length" or "cancelled" on a sequence\'s last response, which carries all '
           'seven outputs; the responses before it carry text_output and num_output_tokens, '
           'plus sequence_index when not 0 and the log-probabilities when asked for (an absent '
           'output reads as its default: empty, 0).'),
    Tensor("num_input_tokens", DType.INT32, (1,), False, "Prompt length in tokens (on the last response)."),
    Tensor("num_output_tokens", DType.INT32, (1,), False, "Tokens carried by this response."),
    Tensor("sequence_index", DType.INT32, (1,), False,
           "Which of the num_return_sequences sequences (from 0) this response carries; each "
           "sequence's last response has its finish_reason."),
    Tensor("output_log_probs", DType.FP32, (-1,), False,
           "With return_log_probs: the log-probability of each token of this response; else empty."),
    Tensor("output_top_log_probs", DType.STRING, (1,), False,
           'With return_log_probs: JSON, one entry per token of this response, '
           '{"token": its text, "top": [[text, log-probability], ...]} (top_logprobs of '
           'them, most likely first); else empty.'),
)

# ----------------------------------------------------------------------------------------
# The engine contract: NVIDIA's tensorrt_llm backend (inflight_batcher_llm) model. The
# request parameters' engine inputs come from the table; these are the others.
_ENGINE_CORE_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("input_ids", DType.INT32, (-1,), False, "Prompt token ids."),
    Tensor("input_lengths", DType.INT32, (1,), False, "Number of prompt tokens."),
)
_ENGINE_CONTROL_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("stop", DType.BOOL, (1,), True, "Cancel the live request with this request id."),
    Tensor("embedding_bias", DType.FP32, (-1,), True),
)


# LoRA weights for the TensorRT-LLM C++ backend, which caches adapters by lora_task_id and
# refuses a task id it has not been sent the weights of: preprocessing sends them (from the
# adapter folder TensorRT-LLM's hf_lora_convert.py writes) with an adapter's first request
# and leaves them out after; only ensembles of a C++ deployment with LoRA wire them.
LORA_ENGINE_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("lora_weights", DType.FP16, (-1, -1), True,
           "Adapter weights, [modules x layers, in/out weights] (model.lora_weights.npy)."),
    Tensor("lora_config", DType.INT32, (-1, 3), True,
           "Per row of lora_weights: module id, layer, rank (model.lora_config.npy)."),
)
LORA_WEIGHTS_FILE: Final = "model.lora_weights.npy"
LORA_CONFIG_FILE: Final = "model.lora_config.npy"


def _engine_inputs() -> tuple[Tensor, ...]:
    from_table = [t for p in REQUEST_PARAMETERS if (t := p.engine_tensor) is not None]
    required = {"request_output_len"}
    from_table = [t.renamed(t.name, optional=t.name not in required) for t in from_table]
    return (*_ENGINE_CORE_INPUTS, *from_table, *_ENGINE_CONTROL_INPUTS)


ENGINE_INPUTS: Final[tuple[Tensor, ...]] = _engine_inputs()

ENGINE_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("output_ids", DType.INT32, (-1, -1), False, "Generated ids, beam x tokens."),
    Tensor("sequence_length", DType.INT32, (-1,), False, "Tokens per beam in output_ids."),
    Tensor("cum_log_probs", DType.FP32, (-1,), False),
    Tensor("output_log_probs", DType.FP32, (-1, -1), False),
    Tensor("sequence_index", DType.INT32, (1,), False,
           "Which of num_return_sequences this response carries (the C++ backend sends it only "
           "when num_return_sequences > 1: absent means 0)."),
)

# tritonforge's engine model leaves out of a response every output at its default (empty
# string, sequence_index 0, log-probabilities not asked for) and sends num_input_tokens only
# with a finish reason (``engine.request.engine_outputs``):
# an absent output reads as that default, and the ensemble passes it on as an absent optional
# input. tritonforge's engine model adds outputs the C++ backend lacks. Triton ensembles refuse a
# step (or the ensemble's outputs) fed both by a decoupled model and by tensors from before
# it (server issue 7275), so postprocessing can only read what the engine returns: these
# carry what it needs.
ENGINE_EXTRA_OUTPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("finish_reason", DType.STRING, (1,), False, "Set on the last response."),
    Tensor("num_input_tokens", DType.INT32, (1,), False, "Prompt length in tokens (with finish_reason)."),
    Tensor("request_key", DType.UINT64, (1,), False,
           "The engine's own key of the request (see engine_request_id)."),
    Tensor("error", DType.STRING, (1,), False,
           "Empty, or on a last response with finish_reason 'error': the tagged error "
           "(format_error) of a request that failed after it had streamed."),
    Tensor("top_log_probs", DType.STRING, (1,), False,
           "With top_logprobs > 0: JSON, per token of output_ids, its [[token id, "
           "log-probability], ...] most likely first; else empty."),
)

# Why a request that has already streamed fails in-band (a final response carrying
# ``error``) rather than with an error response: Triton 2.51's ensemble scheduler stops
# counting a request's in-flight steps once one step has answered an error, so an engine
# error that overtakes the postprocessing of its previous response leaves the ensemble
# request in flight for ever (fixed upstream in triton-inference-server/core PR #466, 2026).
# Postprocessing, the last step, turns ``error`` into the error response; a stream that was
# cancelled ends with a plain final response (finish_reason "cancelled") for the same reason.


# The environment variable naming the drain file: when it appears, tritonforge's engine
# models end every live request ("server is shutting down") and refuse new ones. Set by the
# launcher (runtime.server) before it stops the server.
DRAIN_FILE_ENV: Final = "TRITONFORGE_DRAIN_FILE"
# The environment variable naming the restart file: a tritonforge model writes why there when
# the server must be started again (``stub_health.StallWatch``); the launcher restarts it.
RESTART_FILE_ENV: Final = "TRITONFORGE_RESTART_FILE"
# The HTTP front (``runtime.front``, in ``tritonforge serve``'s default path) tags each
# non-streamed ``generate``/``infer`` request with a key of its own (a JSON key of the
# ``generate`` body, a header of ``infer`` that Triton forwards as a request parameter, both
# arriving as this request parameter); when the client disconnects before the answer, it
# creates a file named by the key in the folder this environment variable names. Triton
# 2.51's HTTP frontend gives no signal of its own for such a request; the ``_sync`` model
# stops the engine when its request's key turns up there, as for a cancelled gRPC call.
FRONT_KEY_PARAMETER: Final = "tritonforge-front-key"
CANCEL_DIR_ENV: Final = "TRITONFORGE_CANCEL_DIR"
FRONT_KEY_PATTERN: Final = re.compile(r"[0-9a-f]{32}")  # what the front sends (uuid4 hex)


def engine_request_id(key: int) -> str:
    """The request id a stop request carries to cancel exactly the engine request ``key``.

    tritonforge's engine model answers every response with its own ``request_key`` (unique
    in the engine, unlike a client's request id, which two clients may share or leave
    empty). A step that learns that the client left -- postprocessing, which Triton's
    ensemble scheduler tells (its request is cancelled), or the BLS model -- sends the
    ``stop`` request with this id; the engine also accepts the client's id (TensorRT-LLM's
    semantics), which is all the C++ backend understands.
    """
    return f"tritonforge-key-{int(key):016x}"

# The request that cancels a live request: the engine contract's ``stop`` input, sent with
# the request id of the request to cancel (TensorRT-LLM's semantics; tritonforge's engine
# model does the same). The other inputs are the engine's required ones, with dummy values.
# (engine input, value); every tensor is shaped [1, 1].
STOP_REQUEST: Final[tuple[tuple[str, DType, Any], ...]] = (
    ("input_ids", DType.INT32, 0),
    ("input_lengths", DType.INT32, 1),
    ("request_output_len", DType.INT32, 1),
    ("stop", DType.BOOL, True),
)


def is_stop_request(inputs: Mapping[str, Any]) -> bool:
    """Whether engine inputs (name -> array or None) are a stop request."""
    stop = inputs.get("stop")
    if stop is None:
        return False
    flat = stop.reshape(-1) if hasattr(stop, "reshape") else [stop]
    return bool(len(flat)) and bool(flat[0])


# ----------------------------------------------------------------------------------------
# tritonforge's preprocessing and postprocessing models.
# Preprocessing receives every ensemble input, validates the whole request in one place
# (INVALID_ARG naming the parameter), fills the spec's defaults, and hands the engine a
# complete set of engine inputs: output ``out_<engine input>`` feeds engine input
# ``<engine input>``. So both engines see the same, already-checked values.
PREPROCESSING_INPUTS: Final[tuple[Tensor, ...]] = ENSEMBLE_INPUTS

PREPROCESSED_ENGINE_INPUTS: Final[tuple[str, ...]] = (
    "input_ids", "input_lengths",
    *(n for p in REQUEST_PARAMETERS if (n := p.engine_name) is not None),
)
PRE_OUTPUT_PREFIX: Final = "out_"


def pre_output(engine_input: str) -> str:
    """Name of the preprocessing output that feeds ``engine_input``."""
    return PRE_OUTPUT_PREFIX + engine_input


def engine_inputs_for(engine: EngineKind, features: Iterable[str] = ()) -> tuple[str, ...]:
    """The preprocessed engine inputs an ensemble wires to ``engine`` (with the spec's
    ``features`` on): a parameter the engine does not honour is not sent to it."""
    on = set(features)
    skip = {n for p in REQUEST_PARAMETERS if (n := p.engine_name) is not None
            and (engine not in p.engines or (p.requires is not None and p.requires not in on))}
    return tuple(n for n in PREPROCESSED_ENGINE_INPUTS if n not in skip)


_ENGINE_IN = by_name(ENGINE_INPUTS)
PREPROCESSING_OUTPUTS: Final[tuple[Tensor, ...]] = tuple(
    _ENGINE_IN[n].renamed(pre_output(n), optional=False) for n in PREPROCESSED_ENGINE_INPUTS
)

POSTPROCESSING_INPUTS: Final[tuple[Tensor, ...]] = (
    Tensor("output_ids", DType.INT32, (-1, -1)),
    Tensor("sequence_length", DType.INT32, (-1,)),
    Tensor("engine_finish_reason", DType.STRING, (1,), True),
    Tensor("engine_num_input_tokens", DType.INT32, (1,), True),
    Tensor("engine_request_key", DType.UINT64, (1,), True),
    Tensor("engine_error", DType.STRING, (1,), True),
    Tensor("engine_output_log_probs", DType.FP32, (-1, -1), True),
    Tensor("engine_top_log_probs", DType.STRING, (1,), True),
    Tensor("engine_sequence_index", DType.INT32, (1,), True),
)
POSTPROCESSING_OUTPUTS: Final[tuple[Tensor, ...]] = ENSEMBLE_OUTPUTS

# Where each postprocessing input comes from: the engine step only (see
# ENGINE_EXTRA_OUTPUTS). Optional sources are mapped only when the engine declares them.
# Detokenization state is keyed by the engine's request key when the engine sends one, else
# by the request id, which ensembles pass on to every step.
POSTPROCESSING_SOURCES: Final[dict[str, tuple[str, str]]] = {
    "output_ids": ("engine", "output_ids"),
    "sequence_length": ("engine", "sequence_length"),
    "engine_finish_reason": ("engine", "finish_reason"),
    "engine_num_input_tokens": ("engine", "num_input_tokens"),
    "engine_request_key": ("engine", "request_key"),
    "engine_error": ("engine", "error"),
    "engine_output_log_probs": ("engine", "output_log_probs"),
    "engine_top_log_probs": ("engine", "top_log_probs"),
    "engine_sequence_index": ("engine", "sequence_index"),
}


class Param(str, enum.Enum):
    """Keys of the ``parameters`` the generator writes for tritonforge's Python models.

    Values are strings in config.pbtxt (JSON where structured); the models read them back
    with the same keys.
    """

    MODEL = "tritonforge_model"  # model reference: "package:<name>" or a folder path
    TOKENIZER = "tritonforge_tokenizer"  # tokenizer folder/reference; defaults to MODEL
    CHAT_TEMPLATE = "tritonforge_chat_template"  # "messages" | "always"
    SAMPLING_DEFAULTS = "tritonforge_sampling_defaults"  # JSON {parameter: default}
    MAX_MODEL_LEN = "tritonforge_max_model_len"  # context length in tokens
    MAX_PROMPT_BYTES = "tritonforge_max_prompt_bytes"
    LORA_ADAPTERS = "tritonforge_lora_adapters"  # JSON {name: {"id": int, "path": str}}
    ENGINE_ARGS = "tritonforge_engine_args"  # JSON of vLLM AsyncEngineArgs
    ENGINE_KIND = "tritonforge_engine_kind"  # an EngineKind value
    SKIP_SPECIAL_TOKENS = "tritonforge_skip_special_tokens"  # "true" | "false"
    TARGET_MODEL = "tritonforge_target_model"  # BLS / sync model: the model it calls
    ENGINE_MODEL = "tritonforge_engine_model"  # postprocessing / sync: the engine to stop
    MAX_QUEUE_SIZE = "tritonforge_max_queue_size"  # engine: requests waiting before OVERLOADED
    STREAM_INTERVAL_MS = "tritonforge_stream_interval_ms"  # engine: coalescing interval under load
    COALESCE_FROM = "tritonforge_coalesce_from_streams"  # engine: live requests from which it applies
    ENGINE_ENV = "tritonforge_engine_env"  # JSON {VAR: value} set before importing the engine
    ENGINE_DECOUPLED = "tritonforge_engine_decoupled"  # preprocessing: "true" if the engine streams


def _tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (OpenAI's shape), checked."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"{where} must be a non-empty list of tool calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(call, dict) or set(call) - {"id", "type", "function"} or call.get("type", "function")
                != "function" or not isinstance(call.get("id", ""), str) or not isinstance(fn, dict)
                or set(fn) - {"name", "arguments"} or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments"), str)):
            raise ValueError(f'{where}[{j}] must be {{"id", "type": "function", "function": '
                             '{"name": str, "arguments": JSON text}}')
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn["arguments"]}})
    return out


def parse_messages(raw: str, limits: Limits = LIMITS) -> list[dict[str, Any]]:
    """Parse and check the ``messages`` JSON input; raise ``ValueError`` naming the problem.

    Shared by the preprocessing model and the clients so both accept exactly the same input.
    Besides ``role``/``content``/``name``, an assistant message may carry ``tool_calls``
    (its content may then be empty or null) and a tool message its ``tool_call_id``; both
    go on to the chat template.
    """
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"messages must be a JSON list of {{role, content}} objects: {exc}") from None
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty JSON list of {role, content} objects")
    if len(value) > limits.max_messages:
        raise ValueError(f"messages has {len(value)} entries; at most {limits.max_messages} are allowed")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if role not in limits.message_roles:
            raise ValueError(
                f"messages[{i}].role must be one of {', '.join(limits.message_roles)}; got {role!r}"
            )
        calls = msg.get("tool_calls")
        if content is None and calls is not None:
            content = ""
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        allowed = {"role", "content", "name"} | ({"tool_calls"} if role == "assistant" else set()) \
            | ({"tool_call_id"} if role == "tool" else set())
        extra = set(msg) - allowed
        if extra:
            raise ValueError(f"messages[{i}] has unknown keys: {', '.join(sorted(extra))}"
                             " (tool_calls go on assistant messages, tool_call_id on tool ones)")
        one: dict[str, Any] = {"role": role, "content": content}
        if calls is not None:
            one["tool_calls"] = _tool_calls(i, calls)
        if "tool_call_id" in msg:
            if not isinstance(msg["tool_call_id"], str):
                raise ValueError(f"messages[{i}].tool_call_id must be a string")
            one["tool_call_id"] = msg["tool_call_id"]
        out.append(one)
    return out


# ----------------------------------------------------------------------------------------
# The reference table in docs/requests.md (kept in sync by tritonforge.docsync).
def requests_markdown() -> str:
    """The request-parameter reference, one row per table row."""
    names = {EngineKind.VLLM: "vLLM", EngineKind.TRTLLM_CPP: "TRT-LLM C++",
             EngineKind.TRTLLM_LLMAPI: "TRT-LLM LLM API"}
    lines = [
        "| ensemble input | type | engine input | default | allowed | OpenAI field | client field | engines | description |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in REQUEST_PARAMETERS:
        dims = "" if p.dims == (1,) else "[" + ", ".join(map(str, p.dims)) + "]"
        default = "" if p.default is None else json.dumps(list(p.default) if isinstance(p.default, tuple) else p.default)
        engines = "all" if p.engines == _ALL_ENGINES else ", ".join(names[e] for e in ENGINE_KINDS if e in p.engines)
        cells = [f"`{p.name}`", f"{p.dtype.wire}{dims}", f"`{p.engine_name}`" if p.engine_name else "`input_ids`",
                 f"`{default}`" if default else "", p.bounds_text, f"`{p.openai}`" if p.openai else "",
                 f"`{p.client}`" if p.client else "", engines, p.doc.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
