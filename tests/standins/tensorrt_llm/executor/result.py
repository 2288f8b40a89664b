"""Stand-in for ``tensorrt_llm.executor.result`` (see the package docstring): not TensorRT-LLM.

``Logprob`` and ``CompletionOutput`` with the fields of TensorRT-LLM's own
``tensorrt_llm/executor/result.py``: ``CompletionOutput.logprobs`` is a ``LogprobResults``,
per generated token a ``{token id: Logprob(logprob, rank)}`` of the ``logprobs`` most likely
tokens (here with the sampled token too, as vLLM's logprobs have it); ``token_ids_diff`` /
``logprobs_diff`` are what came since the sequence was last updated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CompletionOutput", "Logprob", "LogprobResults"]


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: int | None = None


LogprobResults = list[dict[int, Logprob]]


@dataclass(slots=True)
class CompletionOutput:
    """The output data of one completion output (sequence) of a request."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: LogprobResults = field(default_factory=list)
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] | None = None
    stop_reason: int | str | None = None
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> LogprobResults:
        return self.logprobs[self._last_logprobs_len:]
