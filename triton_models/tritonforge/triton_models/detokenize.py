"""Streaming-exact detokenization.

Decoding each streamed chunk on its own loses the leading space of SentencePiece tokens and
turns a multi-byte character split across tokens (CJK, emoji) into U+FFFD. The
``IncrementalDetokenizer`` decodes a small window of already-seen tokens together with the
new ones and emits only the text that window adds, holding back an incomplete character
until the token that completes it arrives. ``finish()`` reconciles with a full decode, so the
concatenation of every ``push()`` plus ``finish()`` equals ``decode(all_ids)`` exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Decoder", "IncrementalDetokenizer", "make_decoder"]

Decoder = Callable[[Sequence[int]], str]
_REPLACEMENT = "\ufffd"


def make_decoder(tokenizer: object, skip_special_tokens: bool = True) -> Decoder:
    """A fast ``ids -> text`` function for a transformers tokenizer (or a tokenizers.Tokenizer).

    Uses the Rust ``tokenizers`` object directly where there is one: no
    ``clean_up_tokenization_spaces`` rewriting, so text is the plain concatenation vLLM
    produces too.
    """
    backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "decode_batch"):
        backend = tokenizer  # a tokenizers.Tokenizer
    if backend is not None:
        dec = backend.decode

        def decode(ids: Sequence[int]) -> str:
            return str(dec(list(ids), skip_special_tokens=skip_special_tokens))

        return decode
    slow = tokenizer.decode  # type: ignore[attr-defined]

    def decode_slow(ids: Sequence[int]) -> str:
        return str(
            slow(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        )

    return decode_slow


class IncrementalDetokenizer:
    """Per-request state: feed token ids as they stream, get exact text deltas back."""

    __slots__ = ("_decode", "_emitted", "_prefix", "_read", "ids")

    def __init__(self, decode: Decoder) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # tokens whose text has been emitted
        self._emitted: list[str] = []

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (possibly empty)."""
        if not len(new_ids):
            return ""
        self.ids.extend(int(i) for i in new_ids)
        window = self.ids[self._prefix:]
        before = self._decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        text = self._decode(window)
        if len(text) <= len(before) or text.endswith(_REPLACEMENT) or not text.startswith(before):
            return ""  # nothing complete yet (e.g. half a multi-byte character)
        delta = text[len(before):]
        self._prefix = self._read
        self._read = len(self.ids)
        self._emitted.append(delta)
        return delta

    def finish(self) -> str:
        """Flush what is held back, reconciled with a decode of every token.

        A generation cut off (max_tokens) in the middle of a multi-byte character ends with
        bytes that are no character: they are dropped, as vLLM's own detokenizer does,
        rather than shown as U+FFFD.
        """
        full = self._decode(self.ids).rstrip(_REPLACEMENT)
        sent = "".join(self._emitted)
        if full.startswith(sent):
            rest = full[len(sent):]
        else:  # cannot happen for byte-level or SentencePiece tokenizers; never drop text
            rest = self._decode(self.ids[self._read:])
        if rest:
            self._emitted.append(rest)
        self._read = len(self.ids)
        self._prefix = self._read
        return rest

    @property
    def text(self) -> str:
        return "".join(self._emitted)
