"""Preprocessing logic: where every request is validated, tokenized and completed.

Walks the request-parameter table (``tritonforge.contract.REQUEST_PARAMETERS``) once per
request: reads each parameter, checks it against its row (bounds, type, whether this
deployment's engine honours it), fills the spec's defaults and builds the engine inputs.
The engine trusts what this module checked.

Pure Python over numpy arrays (no Triton import), so it is tested without a server; the
Triton model in ``preprocessing_model`` only moves tensors in and out.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from tritonforge import contract
from tritonforge.contract import (
    LIMITS,
    LORA_CONFIG_FILE,
    LORA_WEIGHTS_FILE,
    REQUEST_PARAMETERS,
    SAMPLING_DEFAULTS,
    EngineKind,
    Param,
    ParameterError,
    pre_output,
)
from tritonforge.triton_models.errors import RequestError

__all__ = [
    "LoraWeightsSender",
    "PreprocessSettings",
    "Preprocessor",
    "chat_template_renders_tools",
    "compile_guide",
    "load_converted_lora",
    "load_tokenizer",
    "lower_guide",
    "to_word_list",
]


@dataclass
class PreprocessSettings:
    """What the generator writes into the preprocessing model's parameters."""

    model: str
    tokenizer: str | None = None
    chat_template: str = "messages"  # "messages" | "always"
    defaults: dict[str, Any] = field(default_factory=lambda: dict(SAMPLING_DEFAULTS))
    max_model_len: int = 2048
    max_prompt_bytes: int = LIMITS.max_prompt_bytes
    lora_adapters: dict[str, int] = field(default_factory=dict)  # name -> task id
    engine: EngineKind = EngineKind.VLLM
    lora_paths: dict[int, str] = field(default_factory=dict)  # task id -> adapter folder
    engine_decoupled: bool = True  # whether the engine streams (several responses a request)

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> PreprocessSettings:
        defaults = dict(SAMPLING_DEFAULTS)
        defaults.update({k: v for k, v in json.loads(params.get(Param.SAMPLING_DEFAULTS.value) or "{}").items()
                         if k in defaults})
        adapters = json.loads(params.get(Param.LORA_ADAPTERS.value) or "{}")
        return cls(
            model=params[Param.MODEL.value],
            tokenizer=params.get(Param.TOKENIZER.value) or None,
            chat_template=params.get(Param.CHAT_TEMPLATE.value) or "messages",
            defaults=defaults,
            max_model_len=int(params.get(Param.MAX_MODEL_LEN.value) or 2048),
            max_prompt_bytes=int(params.get(Param.MAX_PROMPT_BYTES.value) or LIMITS.max_prompt_bytes),
            lora_adapters={k: int(v["id"]) for k, v in adapters.items()},
            engine=EngineKind(params.get(Param.ENGINE_KIND.value) or EngineKind.VLLM.value),
            lora_paths={int(v["id"]): str(v["path"]) for v in adapters.values()},
            engine_decoupled=(params.get(Param.ENGINE_DECOUPLED.value) or "true").lower() == "true",
        )


def load_tokenizer(ref: str) -> Any:
    """Load the Hugging Face tokenizer of a model reference (offline)."""
    from transformers import AutoTokenizer
    from tritonforge.runtime.models import resolve_model

    folder = resolve_model(ref)
    return AutoTokenizer.from_pretrained(str(folder))


def to_word_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's ``[2, L]`` word list: row 0 the concatenated ids, row 1 the cumulative
    end offsets, both padded (ids with 0, offsets with -1). No words gives ``[[0], [-1]]``."""
    flat: list[int] = []
    ends: list[int] = []
    for ids in words:
        flat.extend(ids)
        ends.append(len(flat))
    width = max(len(flat), 1)
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(ends)] = ends
    return out


def load_converted_lora(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """An adapter converted by TensorRT-LLM's ``hf_lora_convert.py``: (``lora_weights``
    ``[1, N, D]`` FP16, ``lora_config`` ``[1, N, 3]`` INT32), checked; ``ValueError`` naming
    the folder and the fix otherwise."""
    w_path, c_path = folder / LORA_WEIGHTS_FILE, folder / LORA_CONFIG_FILE
    if not w_path.is_file() or not c_path.is_file():
        raise ValueError(f"LoRA adapter folder {folder}: needs {LORA_WEIGHTS_FILE} and {LORA_CONFIG_FILE} "
                         "as TensorRT-LLM's hf_lora_convert.py writes them; convert the adapter once "
                         "(see docs/tensorrt-llm.md)")
    weights, config = np.load(w_path), np.load(c_path)
    weights = weights[None] if weights.ndim == 2 else weights
    config = config[None] if config.ndim == 2 else config
    if weights.ndim != 3 or weights.shape[0] != 1:
        raise ValueError(f"{w_path}: must be [1, modules x layers, weights]; got {list(weights.shape)}")
    if config.ndim != 3 or config.shape[0] != 1 or config.shape[2] != 3 or config.shape[1] != weights.shape[1]:
        raise ValueError(f"{c_path}: must be [1, {weights.shape[1]}, 3] (one row per row of "
                         f"{LORA_WEIGHTS_FILE}); got {list(config.shape)}")
    if weights.dtype != np.float16:
        raise ValueError(f"{w_path}: the backend takes FP16 lora_weights; got {weights.dtype}. "
                         "Fix: convert with --storage-type float16")
    return weights, config.astype(np.int32)


class LoraWeightsSender:
    """For the TensorRT-LLM C++ backend, which caches adapters by ``lora_task_id``: an
    adapter's weights go with its first request (of this preprocessing instance), its task id
    alone after. Adapters are loaded and checked once, at start."""

    def __init__(self, paths: Mapping[int, str]) -> None:
        self._weights = {task: load_converted_lora(Path(path)) for task, path in paths.items()}
        self._sent: set[int] = set()

    def outputs(self, task_id: int) -> dict[str, np.ndarray]:
        if not task_id or task_id in self._sent or task_id not in self._weights:
            return {}
        self._sent.add(task_id)
        weights, config = self._weights[task_id]
        return {pre_output("lora_weights"): weights, pre_output("lora_config"): config}


def _first(arr: np.ndarray | None) -> Any:
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0].item() if arr.dtype != object else arr.reshape(-1)[0]


def _text(name: str, arr: np.ndarray | None, max_bytes: int) -> str | None:
    value = _first(arr)
    if value is None:
        return None
    if isinstance(value, str):
        raw = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    else:
        raise RequestError(f"{name} must be a string (BYTES tensor); got {type(value).__name__}", param=name)
    if len(raw) > max_bytes:
        raise RequestError(
            f"{name} is {len(raw)} bytes; at most {max_bytes} bytes are allowed "
            f"(raise limits.max_prompt_bytes in the spec to accept more)", param=name)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{name} is not valid UTF-8 (byte {exc.start}): send UTF-8 text", param=name) from None


def _words(name: str, arr: np.ndarray | None) -> list[str] | None:
    if arr is None:
        return None
    out: list[str] = []
    for item in arr.reshape(-1):
        if isinstance(item, (bytes, bytearray)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"{name} contains a word that is not valid UTF-8", param=name) from None
        if not isinstance(item, str):
            raise RequestError(f"{name} must be a list of strings", param=name)
        if item == "":
            continue  # the reference clients send "" for "no words"
        out.append(item)
    return out


# "[16:22:49] /project/cpp/regex_converter.cc:83: " before xgrammar's own message
_XGRAMMAR_PREFIX: Final = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def compile_guide(guide_type: str, guide: str) -> None:
    """Compile a structured-output guide the contract has checked the structure of with
    xgrammar (the grammar library vLLM's and TensorRT-LLM's structured outputs run on; no
    tokenizer needed), so a schema, regex or grammar the engine could not build is refused
    here, naming ``guided_decoding_guide``, rather than failing in the engine."""
    if guide_type not in (contract.GuideType.JSON_SCHEMA.value, contract.GuideType.REGEX.value,
                          contract.GuideType.EBNF_GRAMMAR.value):
        return  # json takes no guide; a choice list is fully checked by its structure
    import xgrammar

    build: Any = {contract.GuideType.JSON_SCHEMA.value: xgrammar.Grammar.from_json_schema,
             contract.GuideType.REGEX.value: xgrammar.Grammar.from_regex,
             contract.GuideType.EBNF_GRAMMAR.value: xgrammar.Grammar.from_ebnf}[guide_type]
    try:
        build(guide)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with its parser's message
        detail = _XGRAMMAR_PREFIX.sub("", " ".join(str(exc).split()))[:500]
        raise RequestError(f"{contract.GUIDE_INPUT} is not a valid {guide_type}: {detail}",
                           param=contract.GUIDE_INPUT) from None


def lower_guide(guide_type: str, guide: str) -> tuple[str, str]:
    """A checked guide as the TensorRT-LLM engines take it (``contract.TRTLLM_GUIDE_TYPES``):
    ``json`` (any JSON object), ``json_schema`` and ``choice`` become an ``ebnf_grammar``
    that xgrammar prints for them -- JSON written compact, as the vLLM engine writes it
    (TensorRT-LLM's own JSON grammars allow free whitespace, which a small model sampling at
    temperature 1 can spend its whole max_tokens on) -- and a choice list, which TensorRT-LLM
    has no guide type for, becomes one alternative per string. ``regex``, ``ebnf_grammar`` and
    no guide pass unchanged. xgrammar's printed grammar is read back by the same xgrammar
    release (0.2's is not readable by 0.1's): preprocessing must run with the engine's
    xgrammar, as it does in the NGC TensorRT-LLM image."""
    kind = contract.GuideType(guide_type) if guide_type else None
    if kind is contract.GuideType.CHOICE:
        choices = json.loads(guide)
        return contract.GuideType.EBNF_GRAMMAR.value, "root ::= " + " | ".join(
            json.dumps(c, ensure_ascii=False) for c in choices)
    if kind in (contract.GuideType.JSON, contract.GuideType.JSON_SCHEMA):
        import xgrammar

        schema = guide if kind is contract.GuideType.JSON_SCHEMA else '{"type": "object"}'
        grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)
        return contract.GuideType.EBNF_GRAMMAR.value, str(grammar)
    return guide_type, guide


def chat_template_renders_tools(template: str) -> bool:
    """Whether a chat template renders the tools a request offers: whether the Jinja
    template reads the ``tools`` variable (what ``apply_chat_template(..., tools=...)``
    passes, Hugging Face's convention). A template that never reads it has no tool support:
    the model is never shown the tools, nor a format to call them in."""
    import jinja2
    import jinja2.meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        names = jinja2.meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return re.search(r"\btools\b", template) is not None
    return "tools" in names


def _calls_as_content(message: dict[str, Any]) -> dict[str, Any]:
    """For a chat template that does not render an assistant's ``tool_calls`` (it would drop
    them): the message with its calls written into its content, as JSON."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    text = json.dumps([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                       for c in calls], ensure_ascii=False)
    content = f"{message['content']}\n{text}" if message["content"] else text
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}


class Preprocessor:
    def __init__(self, settings: PreprocessSettings, tokenizer: Any) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.end_id = int(eos) if eos is not None else 0
        self.pad_id = int(pad) if pad is not None else self.end_id
        self.vocab = int(getattr(tokenizer, "vocab_size", 0) or 0) + len(
            getattr(tokenizer, "added_tokens_decoder", {}) or {})
        self._default_stop = [self._encode_word("stop_words", w)
                              for w in settings.defaults.get("stop_words", ())]
        self.lora_weights: LoraWeightsSender | None = None
        if settings.engine is EngineKind.TRTLLM_CPP and settings.lora_paths:
            self.lora_weights = LoraWeightsSender(settings.lora_paths)

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Preprocessor:
        settings = PreprocessSettings.from_params(params)
        return cls(settings, load_tokenizer(settings.tokenizer or settings.model))

    def _encode_word(self, name: str, word: str) -> list[int]:
        ids = list(self.tokenizer.encode(word, add_special_tokens=False))
        if not ids:
            raise RequestError(f"{name}: word {word!r} encodes to no tokens", param=name)
        return ids

    # -- the request ---------------------------------------------------------------------
    def process(self, inputs: Mapping[str, np.ndarray | None],
                parameters: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Map one request's ensemble inputs (and request parameters) to preprocessing
        outputs; raise RequestError naming the parameter at fault."""
        s = self.settings
        try:
            contract.check_request_parameters(parameters or {})
        except ParameterError as exc:
            raise RequestError(str(exc), param=exc.param) from None
        for name, arr in inputs.items():
            if arr is not None and arr.ndim >= 1 and arr.shape[0] != 1:
                raise RequestError(
                    f"{name} has batch size {arr.shape[0]}; send one prompt per request "
                    "(Triton batches concurrent requests itself)", param=name)
        ids = self._prompt_ids(inputs)

        values: dict[str, Any] = {}
        for p in REQUEST_PARAMETERS:
            if p.kind == "scalar":
                v = _first(inputs.get(p.name))
            elif p.kind == "words":
                v = _words(p.name, inputs.get(p.name))
            elif p.kind == "adapter":
                v = _text(p.name, inputs.get(p.name), LIMITS.max_word_bytes) or None
            elif p.kind == "text":
                v = _text(p.name, inputs.get(p.name), LIMITS.max_guide_bytes)
            else:
                continue
            if v is not None:
                values[p.name] = v
        try:
            contract.check_request_values(values, engine=s.engine)
        except ParameterError as exc:
            raise RequestError(str(exc), param=exc.param) from None
        compile_guide(values.get(contract.GUIDE_TYPE_INPUT, ""), values.get(contract.GUIDE_INPUT, ""))
        for name in ("end_id", "pad_id"):
            if name in values and self.vocab and values[name] >= self.vocab:
                raise RequestError(f"{name} must be a token id in [0, {self.vocab}); got {values[name]}",
                                   param=name)
        filled = self._fill(values, len(ids))
        if s.engine is not EngineKind.VLLM:  # TensorRT-LLM's guide types only
            gt, g = contract.GUIDE_TYPE_INPUT, contract.GUIDE_INPUT
            filled[gt], filled[g] = lower_guide(filled[gt], filled[g])
        if filled["num_return_sequences"] > 1 and not s.engine_decoupled:
            raise RequestError("num_return_sequences must be 1: this deployment's engine does not "
                               "stream (spec streaming: false), so it answers one sequence",
                               param="num_return_sequences")

        out: dict[str, np.ndarray] = {
            pre_output("input_ids"): np.array([ids], dtype=np.int32),
            pre_output("input_lengths"): np.array([[len(ids)]], dtype=np.int32),
        }
        for p in REQUEST_PARAMETERS:
            t = p.engine_tensor
            if t is None:
                continue
            value = filled[p.name]
            if p.kind == "words":
                out[pre_output(t.name)] = to_word_list(value)[None]
            elif p.kind == "text":
                out[pre_output(t.name)] = np.array([[value.encode("utf-8")]], dtype=object)
            else:
                out[pre_output(t.name)] = np.array([[value]], dtype=t.dtype.numpy)
        if self.lora_weights is not None:
            out.update(self.lora_weights.outputs(int(filled["lora_name"])))
        return out

    def _prompt_ids(self, inputs: Mapping[str, np.ndarray | None]) -> list[int]:
        s = self.settings
        text = _text("text_input", inputs.get("text_input"), s.max_prompt_bytes)
        raw_messages = _text("messages", inputs.get("messages"), s.max_prompt_bytes)
        if raw_messages is not None and raw_messages.strip() == "":
            raw_messages = None
        if text is not None and raw_messages is not None and text != "":
            raise RequestError("send either text_input or messages, not both", param="messages")
        if raw_messages is not None:
            try:
                messages = contract.parse_messages(raw_messages)
            except ValueError as exc:
                raise RequestError(str(exc), param="messages") from None
            ids = self._chat_ids(messages)
        elif text is None:
            raise RequestError("text_input is required (or messages, a JSON list of chat messages)",
                               param="text_input")
        elif text == "":
            raise RequestError("text_input is empty; send a non-empty prompt", param="text_input")
        elif s.chat_template == "always":
            ids = self._chat_ids([{"role": "user", "content": text}])
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        if not ids:
            raise RequestError("the prompt encodes to no tokens", param="text_input")
        return ids

    def _fill(self, values: dict[str, Any], prompt_len: int) -> dict[str, Any]:
        """Every engine-bound parameter's value: the request's, else the spec's default,
        else what only the server knows (context room, tokenizer ids, a random seed)."""
        s, d = self.settings, self.settings.defaults
        room = s.max_model_len - prompt_len
        if room < 1:
            raise RequestError(
                f"the prompt is {prompt_len} tokens; the model's context is {s.max_model_len} "
                "tokens, leaving no room to generate: shorten the prompt", param="text_input")
        if "max_tokens" in values:
            max_tokens = int(values["max_tokens"])
            if max_tokens > room:
                raise RequestError(
                    f"max_tokens ({max_tokens}) + the prompt ({prompt_len} tokens) exceeds the "
                    f"model's context of {s.max_model_len} tokens: lower max_tokens to at most {room}",
                    param="max_tokens")
        else:
            max_tokens = min(int(d["max_tokens"]), room)
        min_tokens = int(values.get("min_tokens", d["min_tokens"]))
        if min_tokens > max_tokens:
            raise RequestError(f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})",
                               param="min_tokens")
        fixed = {p.name: p.default for p in REQUEST_PARAMETERS if p.default is not None and not p.spec_default}
        filled = {**fixed, **d, **values, "max_tokens": max_tokens, "min_tokens": min_tokens}
        filled.setdefault("end_id", self.end_id)
        filled.setdefault("pad_id", self.pad_id)
        if filled.get("seed") is None:
            filled["seed"] = int.from_bytes(os.urandom(8), "little") >> 1
        stop = values.get("stop_words")
        filled["stop_words"] = ([self._encode_word("stop_words", w) for w in stop] if stop is not None
                                else self._default_stop)
        filled["bad_words"] = [self._encode_word("bad_words", w) for w in values.get("bad_words", [])]
        filled["lora_name"] = self._lora_id(values.get("lora_name"))
        return filled

    def _lora_id(self, name: str | None) -> int:
        if not name:
            return 0
        adapters = self.settings.lora_adapters
        if name not in adapters:
            known = ", ".join(sorted(adapters)) or "none are configured"
            raise RequestError(f"lora_name {name!r} is not a LoRA adapter of this model ({known})",
                               param="lora_name")
        return adapters[name]

    def _chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        template = getattr(self.tokenizer, "chat_template", None)
        if template is None:
            raise RequestError("this model has no chat template: send text_input instead of messages",
                               param="messages")
        if "tool_calls" not in str(template):
            messages = [_calls_as_content(m) for m in messages]
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # a template that rejects the conversation (e.g. roles order)
            raise RequestError(f"messages rejected by the chat template: {exc}", param="messages") from None
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))
