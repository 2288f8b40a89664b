"""Prompt sets for the load test: shipped datasets, synthetic prompts, a user's JSONL file.

A dataset line is a JSON object with exactly one of ``prompt`` (text) or ``messages``
(chat: ``[{"role": ..., "content": ...}]``), and optionally ``max_tokens`` (the output
length asked for) and ``id``::

    {"id": "q1", "messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 48}

Shipped datasets (package data, token counts with SmolLM2's tokenizer, ``max_tokens`` as
written in the file):

==================== ====================== ================== =======================
name                 kind                   input tokens       max_tokens
==================== ====================== ================== =======================
short-chat           chat questions         4 - 16             16 / 24 / 32 / 48
long-summarization   summarize a passage    250 - 350          96 - 128
mixed-zh-en          Chinese + English chat 10 - 64            24 - 64
==================== ====================== ================== =======================

``synthetic:N`` builds prompts of exactly N tokens by cutting windows of the tokenizer's
encoding of the shipped texts (genai-perf builds synthetic prompts the same way, from a
corpus); anything else is read as a path to a JSONL file.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from tritonforge.loadtests.tokens import TokenCounter

__all__ = [
    "BUILTIN_DATASETS",
    "DatasetError",
    "DatasetInfo",
    "Prompt",
    "PromptPool",
    "cached_prompts",
    "load_dataset",
]


class DatasetError(Exception):
    """A dataset setting or file that cannot be used; the message names the line and fix."""


@dataclass(frozen=True)
class DatasetInfo:
    """A shipped dataset and its controlled length ranges (inclusive)."""

    name: str
    filename: str
    description: str
    input_tokens: tuple[int, int]
    max_tokens: tuple[int, int]


BUILTIN_DATASETS: Final[dict[str, DatasetInfo]] = {
    d.name: d
    for d in (
        DatasetInfo("short-chat", "short_chat.jsonl", "short chat questions", (4, 16), (16, 48)),
        DatasetInfo("long-summarization", "long_summarization.jsonl",
                    "summarize a ~300-token passage", (250, 350), (96, 128)),
        DatasetInfo("mixed-zh-en", "mixed_zh_en.jsonl", "chat mixing Chinese and English",
                    (10, 64), (24, 64)),
    )
}
SYNTHETIC_PREFIX: Final = "synthetic:"
_MAX_SYNTHETIC: Final = 8192


@dataclass(frozen=True)
class Prompt:
    """One prompt: text or chat messages, the output length to ask for, its input tokens."""

    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    input_tokens: int = -1
    id: str = ""

    def text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.get("content", "") for m in self.messages or ())


class PromptPool:
    """Prompts served round-robin from a shuffled order (each user gets its own pool)."""

    def __init__(self, prompts: list[Prompt], seed: int | None = None) -> None:
        if not prompts:
            raise DatasetError("the dataset has no prompts")
        self._prompts = list(prompts)
        random.Random(seed).shuffle(self._prompts)
        self._i = 0

    def __len__(self) -> int:
        return len(self._prompts)

    def next(self) -> Prompt:
        p = self._prompts[self._i % len(self._prompts)]
        self._i += 1
        return p


def _parse_line(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - {"prompt", "messages", "max_tokens", "id"}
    if unknown:
        raise DatasetError(f"{where}: unknown keys {sorted(unknown)}; allowed: prompt, messages,"
                           " max_tokens, id")
    has_p, has_m = "prompt" in obj, "messages" in obj
    if has_p == has_m:
        raise DatasetError(f"{where}: give exactly one of 'prompt' or 'messages'")
    prompt = messages = None
    if has_p:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise DatasetError(f"{where}: 'prompt' must be a non-empty string")
        prompt = obj["prompt"]
    else:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in msgs
        ):
            raise DatasetError(f"{where}: 'messages' must be a non-empty list of"
                               " {\"role\": str, \"content\": str}")
        messages = tuple({"role": m["role"], "content": m["content"]} for m in msgs)
    mt = obj.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise DatasetError(f"{where}: 'max_tokens' must be a positive integer, got {mt!r}")
    return Prompt(prompt=prompt, messages=messages, max_tokens=mt, id=str(obj.get("id", "")))


def read_jsonl(text: str, source: str) -> list[Prompt]:
    """Parse JSONL text (blank lines skipped); raises :class:`DatasetError` naming the line."""
    out: list[Prompt] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not valid JSON ({exc.msg})") from None
        out.append(_parse_line(obj, where))
    if not out:
        raise DatasetError(f"{source}: no prompts in the file")
    return out


def builtin_text(name: str) -> str:
    info = BUILTIN_DATASETS[name]
    return (resources.files("tritonforge.loadtests") / "data" / info.filename).read_text("utf-8")


def synthetic(tokens: int, counter: TokenCounter, count: int = 64, seed: int | None = 0) -> list[Prompt]:
    """``count`` prompts of exactly ``tokens`` token ids, cut from the shipped texts."""
    corpus: list[int] = []
    for name in BUILTIN_DATASETS:
        for p in read_jsonl(builtin_text(name), name):
            corpus.extend(counter.encode(p.text() + "\n"))
    while len(corpus) < tokens + 1:
        corpus = corpus + corpus
    rng = random.Random(seed)
    out = []
    for i in range(count):
        start = rng.randrange(0, len(corpus) - tokens + 1)
        out.append(Prompt(prompt=counter.decode(corpus[start : start + tokens]),
                          input_tokens=tokens, id=f"synthetic-{i}"))
    return out


def load_dataset(ref: str, counter: TokenCounter, *, max_tokens: int | None = None,
                 seed: int | None = 0) -> list[Prompt]:
    """Prompts for ``ref``: a shipped name, ``synthetic:N`` or a JSONL path.

    ``max_tokens`` (when given) replaces every prompt's own output length. Input tokens
    are counted with ``counter``.
    """
    ref = ref.strip()
    if ref.startswith(SYNTHETIC_PREFIX):
        raw = ref[len(SYNTHETIC_PREFIX):]
        if not raw.isdigit() or not 1 <= int(raw) <= _MAX_SYNTHETIC:
            raise DatasetError(f"dataset {ref!r}: synthetic:N needs N in [1, {_MAX_SYNTHETIC}]"
                               f" (the prompt length in tokens), got {raw!r}")
        prompts = synthetic(int(raw), counter, seed=seed)
    elif ref in BUILTIN_DATASETS:
        prompts = read_jsonl(builtin_text(ref), ref)
    else:
        path = Path(ref).expanduser()
        if not path.is_file():
            known = ", ".join([*BUILTIN_DATASETS, "synthetic:N"])
            raise DatasetError(f"dataset {ref!r} is neither a shipped dataset ({known})"
                               " nor an existing JSONL file")
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"dataset {ref!r}: cannot read it ({exc})") from None
        prompts = read_jsonl(text, str(path))
    out = []
    for p in prompts:
        n = p.input_tokens if p.input_tokens >= 0 else counter.count(p.text())
        out.append(Prompt(prompt=p.prompt, messages=p.messages,
                          max_tokens=max_tokens if max_tokens is not None else p.max_tokens,
                          input_tokens=n, id=p.id))
    return out


_cache_lock = threading.Lock()


@functools.cache
def _cached(ref: str, tokenizer: str, max_tokens: int | None, seed: int | None) -> tuple[Prompt, ...]:
    from tritonforge.loadtests.tokens import load_token_counter

    return tuple(load_dataset(ref, load_token_counter(tokenizer), max_tokens=max_tokens, seed=seed))


def cached_prompts(ref: str, tokenizer: str, *, max_tokens: int | None = None,
                   seed: int | None = 0) -> list[Prompt]:
    """:func:`load_dataset` with the tokenizer named by reference, loaded once per process."""
    with _cache_lock:
        return list(_cached(ref, tokenizer, max_tokens, seed))
