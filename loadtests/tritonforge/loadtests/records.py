"""One finished request as the load test measured it, and the per-process collector.

A :class:`Record` is what a user produces for every logical request (no I/O here). Workers
ship their records to the master inside Locust's periodic worker report (a plain list, so
it survives msgpack); the master merges them and computes the summary from all of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["Collector", "Record"]


@dataclass(frozen=True)
class Record:
    """One request (times in seconds).

    ``start`` is the wall-clock send time (epoch seconds), ``ttft`` the first response
    minus the send time (``None`` when no token arrived), ``latency`` the last response
    minus the send time, ``output_tokens`` the returned text re-tokenized with the served
    model's tokenizer, ``input_tokens`` the prompt's token count (``-1`` unknown),
    ``error`` the failure message (``""`` on success).
    """

    start: float
    ttft: float | None
    latency: float
    output_tokens: int
    input_tokens: int = -1
    error: str = ""
    streaming: bool = True

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def end(self) -> float:
        return self.start + self.latency

    @property
    def itl(self) -> float | None:
        """genai-perf's inter-token latency: (latency - TTFT) / (output tokens - 1)."""
        if not self.ok or not self.streaming or self.ttft is None or self.output_tokens < 2:
            return None
        return max(0.0, self.latency - self.ttft) / (self.output_tokens - 1)

    def to_wire(self) -> list[Any]:
        return [self.start, self.ttft, self.latency, self.output_tokens, self.input_tokens,
                self.error, self.streaming]

    @classmethod
    def from_wire(cls, row: list[Any]) -> Record:
        start, ttft, latency, out, inp, error, streaming = row
        return cls(float(start), None if ttft is None else float(ttft), float(latency),
                   int(out), int(inp), str(error), bool(streaming))


class Collector:
    """Thread-safe list of records with a ``drain`` for shipping batches to the master."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: list[Record] = []
        self._pending: list[Record] = []
        self.by_source: dict[str, int] = {}

    def add(self, record: Record, source: str = "local") -> None:
        with self._lock:
            self._all.append(record)
            self._pending.append(record)
            self.by_source[source] = self.by_source.get(source, 0) + 1

    def extend(self, records: list[Record], source: str) -> None:
        with self._lock:
            self._all.extend(records)
            self.by_source[source] = self.by_source.get(source, 0) + len(records)

    def drain(self) -> list[Record]:
        """Records added since the last drain (what a worker has not reported yet)."""
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._all)

    def clear(self) -> None:
        with self._lock:
            self._all.clear()
            self._pending.clear()
            self.by_source.clear()
