"""Preprocessing logic: validate a request, tokenize it, fill defaults, build engine inputs.

Pure Python over numpy arrays (no Triton import), so it is tested without a server; the
Triton model in ``preprocessing_model`` only moves tensors in and out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from tritonforge import contract
from tritonforge.triton_models.errors import RequestError
from tritonforge.contract import LIMITS, Param, SamplingDefaults, pre_output

__all__ = ["PreprocessSettings", "Preprocessor", "load_tokenizer", "to_word_list"]

_SCALAR_INPUTS = (
    "max_tokens", "end_id", "pad_id", "top_k", "top_p", "temperature", "length_penalty",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens", "seed",
    "beam_width", "stream", "exclude_input_in_output",
)


@dataclass
class PreprocessSettings:
    """What the generator writes into the preprocessing model's parameters."""

    model: str
    tokenizer: str | None = None
    chat_template: str = "messages"  # "messages" | "always"
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    default_stop_words: tuple[str, ...] = ()
    max_model_len: int = 2048
    max_prompt_bytes: int = LIMITS.max_prompt_bytes
    lora_adapters: dict[str, int] = field(default_factory=dict)  # name -> task id

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> PreprocessSettings:
        known = {f.name for f in fields(SamplingDefaults)}
        raw_defaults = json.loads(params.get(Param.SAMPLING_DEFAULTS.value) or "{}")
        defaults = SamplingDefaults(**{k: v for k, v in raw_defaults.items() if k in known})
        adapters = json.loads(params.get(Param.LORA_ADAPTERS.value) or "{}")
        return cls(
            model=params[Param.MODEL.value],
            tokenizer=params.get(Param.TOKENIZER.value) or None,
            chat_template=params.get(Param.CHAT_TEMPLATE.value) or "messages",
            defaults=defaults,
            default_stop_words=tuple(json.loads(params.get(Param.DEFAULT_STOP_WORDS.value) or "[]")),
            max_model_len=int(params.get(Param.MAX_MODEL_LEN.value) or 2048),
            max_prompt_bytes=int(params.get(Param.MAX_PROMPT_BYTES.value) or LIMITS.max_prompt_bytes),
            lora_adapters={k: int(v["id"]) for k, v in adapters.items()},
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


def _first(arr: np.ndarray | None) -> Any:
    if arr is None:
        return None
    if arr.size == 0:
        return None
    return arr.reshape(-1)[0].item() if arr.dtype != object else arr.reshape(-1)[0]


class Preprocessor:
    def __init__(self, settings: PreprocessSettings, tokenizer: Any) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.end_id = int(eos) if eos is not None else 0
        self.pad_id = int(pad) if pad is not None else self.end_id
        self._default_stop = [self._encode_word(w) for w in settings.default_stop_words]

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Preprocessor:
        settings = PreprocessSettings.from_params(params)
        return cls(settings, load_tokenizer(settings.tokenizer or settings.model))

    # -- helpers -------------------------------------------------------------------------
    def _encode_word(self, word: str) -> list[int]:
        ids = list(self.tokenizer.encode(word, add_special_tokens=False))
        if not ids:
            raise RequestError(f"word {word!r} encodes to no tokens")
        return ids

    @staticmethod
    def _text(name: str, arr: np.ndarray | None, max_bytes: int) -> str | None:
        value = _first(arr)
        if value is None:
            return None
        if isinstance(value, str):
            raw = value.encode("utf-8")
        elif isinstance(value, (bytes, bytearray)):
            raw = bytes(value)
        else:
            raise RequestError(f"{name} must be a string (BYTES tensor); got {type(value).__name__}")
        if len(raw) > max_bytes:
            raise RequestError(
                f"{name} is {len(raw)} bytes; at most {max_bytes} bytes are allowed "
                f"(raise limits.max_prompt_bytes in the spec to accept more)"
            )
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"{name} is not valid UTF-8 (byte {exc.start}): send UTF-8 text") from None

    @staticmethod
    def _words(name: str, arr: np.ndarray | None) -> list[str] | None:
        if arr is None:
            return None
        out: list[str] = []
        for item in arr.reshape(-1):
            if isinstance(item, (bytes, bytearray)):
                try:
                    item = bytes(item).decode("utf-8")
                except UnicodeDecodeError:
                    raise RequestError(f"{name} contains a word that is not valid UTF-8") from None
            if not isinstance(item, str):
                raise RequestError(f"{name} must be a list of strings")
            if item == "":
                continue  # the reference clients send "" for "no words"
            out.append(item)
        return out

    # -- the request ---------------------------------------------------------------------
    def process(self, inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """Map one request's ensemble inputs to preprocessing outputs; raise RequestError."""
        s = self.settings
        for name, arr in inputs.items():
            if arr is not None and arr.ndim >= 1 and arr.shape[0] != 1:
                raise RequestError(
                    f"{name} has batch size {arr.shape[0]}; send one prompt per request "
                    "(Triton batches concurrent requests itself)"
                )
        text = self._text("text_input", inputs.get("text_input"), s.max_prompt_bytes)
        raw_messages = self._text("messages", inputs.get("messages"), s.max_prompt_bytes)
        if raw_messages is not None and raw_messages.strip() == "":
            raw_messages = None
        if text is not None and raw_messages is not None and text != "":
            raise RequestError("send either text_input or messages, not both")
        if raw_messages is not None:
            try:
                messages = contract.parse_messages(raw_messages)
            except ValueError as exc:
                raise RequestError(str(exc)) from None
            ids = self._chat_ids(messages)
        elif text is None:
            raise RequestError("text_input is required (or messages, a JSON list of chat messages)")
        elif text == "":
            raise RequestError("text_input is empty; send a non-empty prompt")
        elif s.chat_template == "always":
            ids = self._chat_ids([{"role": "user", "content": text}])
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        if not ids:
            raise RequestError("the prompt encodes to no tokens")

        values: dict[str, Any] = {}
        for name in _SCALAR_INPUTS:
            v = _first(inputs.get(name))
            if v is not None:
                values[name] = v
        for name in ("stop_words", "bad_words"):
            words = self._words(name, inputs.get(name))
            if words is not None:
                values[name] = words
        try:
            contract.check_sampling(values)
        except ValueError as exc:
            raise RequestError(str(exc)) from None

        d = s.defaults
        prompt_len = len(ids)
        room = s.max_model_len - prompt_len
        if room < 1:
            raise RequestError(
                f"the prompt is {prompt_len} tokens; the model's context is {s.max_model_len} "
                "tokens, leaving no room to generate: shorten the prompt"
            )
        if "max_tokens" in values:
            max_tokens = int(values["max_tokens"])
            if max_tokens > room:
                raise RequestError(
                    f"max_tokens ({max_tokens}) + the prompt ({prompt_len} tokens) exceeds the "
                    f"model's context of {s.max_model_len} tokens: lower max_tokens to at most {room}"
                )
        else:
            max_tokens = min(d.max_tokens, room)
        min_tokens = int(values.get("min_tokens", d.min_tokens))
        if min_tokens > max_tokens:
            raise RequestError(f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})")
        vocab = int(getattr(self.tokenizer, "vocab_size", 0) or 0) + len(
            getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        )
        end_id = int(values.get("end_id", self.end_id))
        pad_id = int(values.get("pad_id", self.pad_id))
        for name, tid in (("end_id", end_id), ("pad_id", pad_id)):
            if tid < 0 or (vocab and tid >= vocab):
                raise RequestError(f"{name} must be a token id in [0, {vocab}); got {tid}")

        stop = values.get("stop_words")
        stop_ids = [self._encode_word(w) for w in stop] if stop is not None else self._default_stop
        bad_ids = [self._encode_word(w) for w in values.get("bad_words", [])]

        lora_id = 0
        lora_name = self._text("lora_name", inputs.get("lora_name"), LIMITS.max_word_bytes)
        if lora_name:
            if lora_name not in s.lora_adapters:
                known = ", ".join(sorted(s.lora_adapters)) or "none are configured"
                raise RequestError(f"lora_name {lora_name!r} is not a LoRA adapter of this model ({known})")
            lora_id = s.lora_adapters[lora_name]

        seed = values.get("seed")
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1

        def one(value: Any, dtype: str) -> np.ndarray:
            return np.array([[value]], dtype=dtype)

        out: dict[str, np.ndarray] = {
            pre_output("input_ids"): np.array([ids], dtype=np.int32),
            pre_output("input_lengths"): one(prompt_len, "int32"),
            pre_output("request_output_len"): one(max_tokens, "int32"),
            pre_output("end_id"): one(end_id, "int32"),
            pre_output("pad_id"): one(pad_id, "int32"),
            pre_output("runtime_top_k"): one(int(values.get("top_k", d.top_k)), "int32"),
            pre_output("runtime_top_p"): one(float(values.get("top_p", d.top_p)), "float32"),
            pre_output("temperature"): one(float(values.get("temperature", d.temperature)), "float32"),
            pre_output("len_penalty"): one(float(values.get("length_penalty", d.length_penalty)), "float32"),
            pre_output("repetition_penalty"): one(
                float(values.get("repetition_penalty", d.repetition_penalty)), "float32"),
            pre_output("presence_penalty"): one(
                float(values.get("presence_penalty", d.presence_penalty)), "float32"),
            pre_output("frequency_penalty"): one(
                float(values.get("frequency_penalty", d.frequency_penalty)), "float32"),
            pre_output("min_tokens"): one(min_tokens, "int32"),
            pre_output("seed"): one(int(seed), "uint64"),
            pre_output("beam_width"): one(int(values.get("beam_width", d.beam_width)), "int32"),
            pre_output("streaming"): one(bool(values.get("stream", d.stream)), "bool"),
            pre_output("exclude_input_in_output"): one(
                bool(values.get("exclude_input_in_output", d.exclude_input_in_output)), "bool"),
            pre_output("stop_words_list"): to_word_list(stop_ids)[None],
            pre_output("bad_words_list"): to_word_list(bad_ids)[None],
            pre_output("lora_task_id"): one(lora_id, "uint64"),
        }
        return out

    def _chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError("this model has no chat template: send text_input instead of messages")
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # a template that rejects the conversation (e.g. roles order)
            raise RequestError(f"messages rejected by the chat template: {exc}") from None
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))


def settings_dict(settings: PreprocessSettings) -> dict[str, Any]:
    return asdict(settings)
