"""One request in engine-contract terms, whatever engine serves it (no Triton, no engine import).

The engine model reads the engine contract's tensors (TensorRT-LLM's names, see
``tritonforge.contract``) into an :class:`EngineRequest`. Values were validated once, by
preprocessing, against the request-parameter table; here only the structure is checked
(an engine model can also be called directly, e.g. by the BLS model). The sampling
parameters travel as ``EngineRequest.sampling`` (engine input name -> value) and each engine
adapter maps them to its own sampling object with one line per parameter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from tritonforge.contract import REQUEST_PARAMETERS
from tritonforge.triton_models.errors import RequestError

__all__ = [
    "SAMPLING_INPUTS",
    "EngineRequest",
    "StopMatcher",
    "engine_outputs",
    "from_word_list",
    "parse_engine_inputs",
]

# Engine inputs the engine model handles itself (EngineRequest fields); every other scalar
# engine input of the parameter table is a sampling parameter for the adapter to map.
_STRUCTURAL: Final[dict[str, tuple[str, type]]] = {
    "request_output_len": ("max_tokens", int),
    "streaming": ("streaming", bool),
    "exclude_input_in_output": ("exclude_input_in_output", bool),
    "end_id": ("end_id", int),
    "lora_task_id": ("lora_task_id", int),
    "return_log_probs": ("return_log_probs", bool),
    "top_logprobs": ("top_logprobs", int),
    "num_return_sequences": ("n", int),
}
_WORDS: Final[dict[str, str]] = {
    p.engine_name: p.name for p in REQUEST_PARAMETERS if p.kind == "words" and p.engine_name
}
# Engine inputs that carry one string (structured-output guides): EngineRequest fields.
_TEXTS: Final[dict[str, str]] = {
    "guided_decoding_guide_type": "guide_type",
    "guided_decoding_guide": "guide",
}
if set(_TEXTS) != {p.engine_name for p in REQUEST_PARAMETERS if p.kind == "text"}:  # pragma: no cover
    raise ImportError("tritonforge's engine request has no field for a text input of the table")
SAMPLING_INPUTS: Final[frozenset[str]] = frozenset(
    n for p in REQUEST_PARAMETERS
    if (n := p.engine_name) is not None and p.kind == "scalar" and n not in _STRUCTURAL
)


def from_word_list(arr: np.ndarray | None) -> list[list[int]]:
    """Inverse of the ``[2, L]`` word-list format (a leading batch dim of 1 is allowed)."""
    if arr is None or arr.size == 0:
        return []
    a = np.asarray(arr)
    if a.ndim == 3:
        a = a[0]
    if a.ndim != 2 or a.shape[0] != 2:
        raise RequestError(f"word lists must have shape [2, L]; got {list(a.shape)}")
    ids, ends = a[0].tolist(), a[1].tolist()
    words: list[list[int]] = []
    start = 0
    for end in ends:
        if end < 0:
            break
        if end < start or end > len(ids):
            raise RequestError("word list offsets must be increasing and within the id row")
        if end > start:
            words.append([int(i) for i in ids[start:end]])
        start = end
    return words


@dataclass
class EngineRequest:
    """One request as the engine model serves it."""

    input_ids: list[int]
    max_tokens: int
    streaming: bool = False
    exclude_input_in_output: bool = True
    end_id: int | None = None
    lora_task_id: int = 0
    return_log_probs: bool = False
    top_logprobs: int = 0  # most likely alternatives per token, with return_log_probs
    n: int = 1  # num_return_sequences: independent sequences, each answered with its index
    guide_type: str = ""  # a contract.GuideType value; "" for none
    guide: str = ""
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)  # engine input -> value


def _scalar(inputs: Mapping[str, np.ndarray | None], name: str) -> Any:
    arr = inputs.get(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0].item()


def parse_engine_inputs(inputs: Mapping[str, np.ndarray | None], *, decoupled: bool) -> EngineRequest:
    """Engine-contract tensors of one request -> EngineRequest; RequestError if unusable."""
    ids_arr = inputs.get("input_ids")
    if ids_arr is None:
        raise RequestError("input_ids is required", param="input_ids")
    if ids_arr.ndim == 2 and ids_arr.shape[0] != 1:
        raise RequestError(f"one sequence per request: input_ids has batch size {ids_arr.shape[0]}",
                           param="input_ids")
    ids = [int(i) for i in ids_arr.reshape(-1)]
    n = _scalar(inputs, "input_lengths")
    if n is not None:
        if not 0 < int(n) <= len(ids):
            raise RequestError(f"input_lengths ({n}) must be in [1, {len(ids)}] (the input_ids given)",
                               param="input_lengths")
        ids = ids[: int(n)]
    if not ids:
        raise RequestError("input_ids is empty", param="input_ids")
    max_tokens = _scalar(inputs, "request_output_len")
    if max_tokens is None or int(max_tokens) < 1:
        raise RequestError(f"request_output_len must be >= 1; got {max_tokens}", param="request_output_len")
    req = EngineRequest(input_ids=ids, max_tokens=int(max_tokens))
    for name, (attr, convert) in _STRUCTURAL.items():
        if name != "request_output_len" and (v := _scalar(inputs, name)) is not None:
            setattr(req, attr, convert(v))
    for name in SAMPLING_INPUTS:
        if (v := _scalar(inputs, name)) is not None:
            req.sampling[name] = v
    for name, attr in _TEXTS.items():
        arr = inputs.get(name)
        if arr is not None and arr.size:
            v = arr.reshape(-1)[0]
            setattr(req, attr, bytes(v).decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v))
    req.stop_words = from_word_list(inputs.get("stop_words_list"))
    req.bad_words = from_word_list(inputs.get("bad_words_list"))
    if not decoupled:
        req.streaming = False
        if req.n > 1:  # one response per request: the sequences would be lost
            raise RequestError("num_return_sequences must be 1 on a non-streaming (not decoupled) "
                               "engine model", param="num_return_sequences")
    return req


class StopMatcher:
    """Id-level stop words with hold-back, so a stop word never leaks into the output."""

    def __init__(self, stops: list[list[int]]) -> None:
        self.stops = [s for s in stops if s]
        self.generated: list[int] = []
        self.held = 0  # trailing tokens of `generated` not yet released

    def feed(self, new_ids: list[int]) -> tuple[list[int], bool]:
        """Return (tokens safe to emit, stopped)."""
        if not self.stops:
            return new_ids, False
        for tok in new_ids:
            self.generated.append(tok)
            self.held += 1
            for stop in self.stops:
                if len(self.generated) >= len(stop) and self.generated[-len(stop):] == stop:
                    keep = self.held - len(stop)
                    out = self.generated[len(self.generated) - self.held:len(self.generated) - len(stop)] if keep > 0 else []
                    del self.generated[len(self.generated) - len(stop):]
                    self.held = 0
                    return out, True
        hold = self._partial()
        release = self.held - hold
        out = self.generated[len(self.generated) - self.held:len(self.generated) - hold] if release > 0 else []
        self.held = hold
        return out, False

    def _partial(self) -> int:
        """Length of the longest suffix of `generated` (within held) that starts a stop word."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, self.held), 0, -1):
                if self.generated[-k:] == stop[:k]:
                    best = max(best, k)
                    break
        return best

    def flush(self) -> list[int]:
        out = self.generated[len(self.generated) - self.held:] if self.held else []
        self.held = 0
        return out


def engine_outputs(
    ids: list[int], finish: str, n_input: int, logprobs: list[float] | None = None,
    key: int = 0, error: str = "", top: list[list[tuple[int, float]]] | None = None,
    sequence: int = 0, *, every: bool = False,
) -> dict[str, np.ndarray]:
    """The engine contract's outputs for one response (one beam); ``key`` is the engine's
    own key of the request (``contract.engine_request_id``), ``error`` the tagged error of a
    request that fails after it has streamed (see ``contract.ENGINE_EXTRA_OUTPUTS``).
    ``logprobs`` (one per id) and ``top`` (the alternatives at each id) only when asked;
    ``sequence`` is which of ``num_return_sequences`` the response carries.

    An output at its default is left out -- ``finish_reason``, ``error`` and
    ``top_log_probs`` empty, ``sequence_index`` 0, log-probabilities not asked for -- and
    the steps that read it take absent for that default (Triton's ensemble passes an output
    a response lacks on as an absent optional input); ``num_input_tokens`` goes out only
    with a finish reason (postprocessing reports it on a sequence's last response).
    ``sequence_length`` always goes: postprocessing requires it, as TensorRT-LLM's does. Each
    tensor of a response costs the engine stub, tritonserver and postprocessing work once
    per streamed response, and a plain stream needs three: ``request_key``, ``output_ids``,
    ``sequence_length``. ``every``: all ten, which the C++ backend's stand-in starts from
    (it then drops what that backend does not send)."""
    out = {
        "request_key": np.array([[key]], dtype=np.uint64),
        "output_ids": np.array([[ids]], dtype=np.int32).reshape(1, 1, len(ids)),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
    }
    if every or finish:
        out["num_input_tokens"] = np.array([[n_input]], dtype=np.int32)
    lp = logprobs if logprobs is not None else []
    if every or sequence:
        out["sequence_index"] = np.array([[sequence]], dtype=np.int32)
    if every or top:
        out["top_log_probs"] = np.array([[json.dumps(top).encode() if top else b""]], dtype=object)
    if every or error:
        out["error"] = np.array([[error.encode()]], dtype=object)
    if every or logprobs is not None:
        out["cum_log_probs"] = np.array([[float(sum(lp))]], dtype=np.float32)
        out["output_log_probs"] = np.array([[lp]], dtype=np.float32).reshape(1, 1, len(lp))
    if every or finish:
        out["finish_reason"] = np.array([[finish.encode()]], dtype=object)
    return out
