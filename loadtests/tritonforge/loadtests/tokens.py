"""Counting tokens with the served model's tokenizer (genai-perf re-tokenizes output text).

The tokenizer setting is a model reference as the deployment spec writes it
(``package:smollm2-135m-instruct``, a ``.gguf`` file, or a Hugging Face folder). When the
resolved folder has a ``tokenizer.json`` it is loaded with the ``tokenizers`` library
directly (well under a second, no transformers import); otherwise through transformers'
``AutoTokenizer`` (``tritonforge.backends.preprocess.load_tokenizer``). Both give the same
ids for the same tokenizer. One counter is cached per reference and process.
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


@functools.cache
def _load(ref: str) -> TokenCounter:
    folder: Path
    try:
        from tritonforge.runtime.models import ModelError, resolve_model

        try:
            folder = resolve_model(ref)
        except ModelError as exc:
            raise TokenizerError(f"tokenizer {ref!r}: {exc}") from None
    except ImportError:  # loadtests installed without the generator part
        folder = Path(ref)
    if not folder.exists():
        raise TokenizerError(f"tokenizer {ref!r}: no such model folder or file")
    tj = folder / "tokenizer.json" if folder.is_dir() else None
    if tj is not None and tj.is_file():
        from tokenizers import Tokenizer

        return TokenCounter(ref, Tokenizer.from_file(str(tj)), fast=True)
    try:
        from transformers import AutoTokenizer

        return TokenCounter(ref, AutoTokenizer.from_pretrained(str(folder)), fast=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad folder
        raise TokenizerError(f"tokenizer {ref!r}: cannot load from {folder}: {exc}") from None


def load_token_counter(ref: str = DEFAULT_TOKENIZER) -> TokenCounter:
    """The (cached) counter for a tokenizer reference; raises :class:`TokenizerError`."""
    with _lock:
        return _load(ref)
