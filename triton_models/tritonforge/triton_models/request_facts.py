"""What postprocessing must know of a request the TensorRT-LLM C++ backend serves.

The C++ backend answers with token ids only: no finish reason, no prompt length, no key of
the request, and Triton's ensemble does not tell postprocessing which engine response is the
last one. Nor can postprocessing read preprocessing's tensors: Triton refuses an ensemble
step fed both by a decoupled model and by tensors from before it (server issue 7275). So
preprocessing, which fills every engine input, writes the few facts postprocessing needs to
end a stream right -- max_tokens, end_id, the stop words' ids, the prompt length, whether it
streams, how many sequences it asks for -- into a small store shared by the models of one
repository (one file per request id, in ``/dev/shm`` where there is one), and postprocessing
reads them on the request's first response and deletes them when its last sequence ends. Requests without a request id cannot be followed this
way (ensembles pass the client's id to every step; tritonforge's clients always send one).

Entries a final response never deletes (a request cancelled before its first response, a
client that vanished) are swept after ``ttl_seconds``. Only the C++ path uses this:
tritonforge's own engine models return the finish reason and their own request key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonforge.contract import pre_output

__all__ = ["FactsStore", "RequestFacts"]

_SHM = Path("/dev/shm")


@dataclass(frozen=True)
class RequestFacts:
    """One request as preprocessing completed it (the engine inputs postprocessing needs)."""

    max_tokens: int
    end_id: int | None
    stop_words: tuple[tuple[int, ...], ...]
    n_input: int
    streaming: bool
    exclude_input: bool = True
    n: int = 1  # num_return_sequences: the request ends when all of them have

    @classmethod
    def from_preprocessed(cls, outputs: Mapping[str, np.ndarray], *, streaming: bool) -> RequestFacts:
        """From preprocessing's outputs (``out_<engine input>``); ``streaming`` is whether
        the engine streams this request (decoupled and asked to)."""
        from tritonforge.triton_models.engine.request import from_word_list

        def one(name: str, default: int | bool | None = None) -> int | bool | None:
            arr = outputs.get(pre_output(name))
            return default if arr is None or arr.size == 0 else arr.reshape(-1)[0].item()

        end = one("end_id")
        return cls(
            max_tokens=int(one("request_output_len", 1) or 1),
            end_id=None if end is None else int(end),
            stop_words=tuple(tuple(w) for w in from_word_list(outputs.get(pre_output("stop_words_list")))),
            n_input=int(one("input_lengths", 0) or 0),
            streaming=streaming,
            exclude_input=bool(one("exclude_input_in_output", True)),
            n=int(one("num_return_sequences", 1) or 1),
        )

    def to_json(self) -> str:
        return json.dumps({"max_tokens": self.max_tokens, "end_id": self.end_id,
                           "stop_words": [list(w) for w in self.stop_words], "n_input": self.n_input,
                           "streaming": self.streaming, "exclude_input": self.exclude_input,
                           "n": self.n})

    @classmethod
    def from_json(cls, text: str) -> RequestFacts:
        d = json.loads(text)
        return cls(int(d["max_tokens"]), None if d["end_id"] is None else int(d["end_id"]),
                   tuple(tuple(int(i) for i in w) for w in d["stop_words"]), int(d["n_input"]),
                   bool(d["streaming"]), bool(d.get("exclude_input", True)), int(d.get("n", 1)))


class FactsStore:
    """One file per request id under ``root``; written by preprocessing, read and deleted by
    postprocessing (separate processes: each model runs in its own stub)."""

    def __init__(self, root: Path, ttl_seconds: float = 900.0) -> None:
        self.root = root
        self.ttl_seconds = ttl_seconds
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._puts = 0

    @classmethod
    def for_model(cls, model_dir: str | os.PathLike[str], ttl_seconds: float = 900.0) -> FactsStore:
        """The store of the repository holding ``model_dir`` (Triton's ``model_repository``
        argument of a model): every model of one repository on one host shares it."""
        repo = str(Path(model_dir).resolve().parent)
        base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else Path(tempfile.gettempdir())
        tag = hashlib.sha256(repo.encode()).hexdigest()[:16]
        return cls(base / f"tritonforge-facts-{os.getuid()}-{tag}", ttl_seconds)

    def _path(self, request_id: str) -> Path:
        return self.root / hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]

    def put(self, request_id: str, facts: RequestFacts) -> None:
        path = self._path(request_id)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(facts.to_json())
        os.replace(tmp, path)
        self._puts += 1
        if self._puts % 512 == 0:
            self.sweep()

    def get(self, request_id: str) -> RequestFacts | None:
        try:
            return RequestFacts.from_json(self._path(request_id).read_text())
        except (OSError, ValueError, KeyError):
            return None

    def drop(self, request_id: str) -> None:
        with contextlib.suppress(OSError):
            self._path(request_id).unlink()

    def count(self) -> int:
        """Entries held now (what a metric of open C++-path requests reports)."""
        try:
            return sum(1 for e in os.scandir(self.root) if not e.name.endswith(".tmp"))
        except OSError:
            return 0

    def sweep(self, now: float | None = None) -> int:
        """Delete entries older than ``ttl_seconds``; how many went."""
        cutoff = (time.time() if now is None else now) - self.ttl_seconds
        gone = 0
        with contextlib.suppress(OSError):
            for e in os.scandir(self.root):
                with contextlib.suppress(OSError):
                    if e.stat().st_mtime < cutoff:
                        os.unlink(e.path)
                        gone += 1
        return gone
