"""Counting tokens with the served model's tokenizer (genai-perf re-tokenizes output text).

The tokenizer setting is a model reference as the deployment spec writes it
(``package:smollm2-135m-instruct``, a ``.gguf`` file, or a Hugging Face folder), or just a
``tokenizer.json`` file (or a folder holding one: no weights needed, e.g. on Locust
workers). When there is a ``tokenizer.json`` it is loaded with the ``tokenizers`` library
directly (well under a second, no transformers import); otherwise through transformers'
``AutoTokenizer``, as ``tritonforge.triton_models.preprocess.load_tokenizer`` does. Both give
the same ids for the same tokenizer. One counter is cached per reference and process.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any, Final

__all__ = ["DEFAULT_TOKENIZER", "TokenCounter", "TokenizerError", "load_token_counter"]

DEFAULT_TOKENIZER: Final = "package:smollm2-135m-instruct"


class TokenizerError(Exception):
    """The tokenizer setting cannot be loaded; the message says why."""


class TokenCounter:
    """Encode/decode/count without special tokens (what the text itself costs)."""

    def __init__(self, ref: str, backend: Any, fast: bool) -> None:
        self.ref = ref
        self._tok = backend
        self._fast = fast

    def encode(self, text: str) -> list[int]:
        if self._fast:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def count(self, text: str) -> int:
        return len(self.encode(text)) if text else 0

    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size() if self._fast else len(self._tok))


_lock = threading.Lock()


def _direct(ref: str) -> Path | None:
    """A ``tokenizer.json`` named directly, or in a folder (no model weights needed)."""
    p = Path(ref).expanduser()
    if p.is_file() and p.suffix == ".json":
        return p
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return p / "tokenizer.json"
    return None


@functools.cache
def _load(ref: str) -> TokenCounter:
    tj = _direct(ref)
    folder: Path | None = None
    if tj is None:
        try:
            from tritonforge.runtime.models import ModelError, resolve_model
        except ImportError:  # loadtests installed without the generator part
            raise TokenizerError(f"tokenizer {ref!r}: give a tokenizer.json file or a folder"
                                 " holding one") from None
        try:
            folder = resolve_model(ref)
        except ModelError as exc:
            raise TokenizerError(f"tokenizer {ref!r}: {exc}") from None
        if (folder / "tokenizer.json").is_file():
            tj = folder / "tokenizer.json"
    if tj is not None:
        from tokenizers import Tokenizer

        try:
            return TokenCounter(ref, Tokenizer.from_file(str(tj)), fast=True)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions
            raise TokenizerError(f"tokenizer {ref!r}: cannot read {tj}: {exc}") from None
    try:
        from transformers import AutoTokenizer

        return TokenCounter(ref, AutoTokenizer.from_pretrained(str(folder)), fast=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad folder
        raise TokenizerError(f"tokenizer {ref!r}: cannot load from {folder}: {exc}") from None


def load_token_counter(ref: str = DEFAULT_TOKENIZER) -> TokenCounter:
    """The (cached) counter for a tokenizer reference; raises :class:`TokenizerError`."""
    with _lock:
        return _load(ref)
