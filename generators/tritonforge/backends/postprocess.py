"""Postprocessing logic: token ids from the engine -> exact text deltas, counts, finish reason.

The ensemble calls postprocessing once per engine response. Detokenization state lives here,
keyed by the ``request_key`` preprocessing drew for the request, so streamed pieces
concatenate to exactly the text of a non-streamed request (see ``detokenize``). State is
dropped when the request finishes, and bounded (least recently used first) in case a
request's end is never seen (a client that went away mid-stream with an engine that does not
report it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonforge.backends.detokenize import Decoder, IncrementalDetokenizer
from tritonforge.contract import FinishReason

__all__ = ["Postprocessor", "PostResult"]


@dataclass
class _State:
    detok: IncrementalDetokenizer
    tokens: int
    touched: float


@dataclass(frozen=True)
class PostResult:
    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "text_output": np.array([[self.text.encode("utf-8")]], dtype=object),
            "finish_reason": np.array([[self.finish_reason.encode("utf-8")]], dtype=object),
            "num_input_tokens": np.array([[self.num_input_tokens]], dtype=np.int32),
            "num_output_tokens": np.array([[self.num_output_tokens]], dtype=np.int32),
        }


def _scalar(arr: np.ndarray | None, default: Any = None) -> Any:
    if arr is None or arr.size == 0:
        return default
    v = arr.reshape(-1)[0]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return v.item() if hasattr(v, "item") else v


class Postprocessor:
    def __init__(self, decode: Decoder, max_states: int = 65536) -> None:
        self.decode = decode
        self.max_states = max_states
        self._states: OrderedDict[int, _State] = OrderedDict()

    @property
    def open_requests(self) -> int:
        return len(self._states)

    def process(self, inputs: Mapping[str, np.ndarray | None]) -> PostResult:
        ids_arr = inputs["output_ids"]
        assert ids_arr is not None
        lengths = inputs.get("sequence_length")
        ids = ids_arr.reshape(-1) if ids_arr.ndim <= 1 else ids_arr.reshape(-1, ids_arr.shape[-1])[0]
        n = int(_scalar(lengths, len(ids)))
        ids = [int(t) for t in ids[: max(0, min(n, len(ids)))]]
        end_id = _scalar(inputs.get("end_id"))
        if end_id is not None and ids and ids[-1] == int(end_id):
            # The C++ backend leaves end_id out; an engine that includes it is trimmed the same.
            ids = ids[:-1]
            hit_end = True
        else:
            hit_end = False
        key = int(_scalar(inputs.get("request_key"), 0))
        now = time.monotonic()
        state = self._states.get(key)
        if state is None:
            state = _State(IncrementalDetokenizer(self.decode), 0, now)
            self._states[key] = state
            while len(self._states) > self.max_states:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
            state.touched = now
        state.tokens += len(ids)
        text = state.detok.push(ids)

        reason = str(_scalar(inputs.get("engine_finish_reason"), "") or "")
        if not reason:
            # The C++ backend does not say why it stopped: infer it.
            limit = _scalar(inputs.get("request_output_len"))
            if hit_end:
                reason = FinishReason.STOP.value
            elif limit is not None and state.tokens >= int(limit):
                reason = FinishReason.LENGTH.value
        if reason:
            text += state.detok.finish()
            self._states.pop(key, None)
        return PostResult(
            text=text,
            finish_reason=reason,
            num_input_tokens=int(_scalar(inputs.get("input_lengths"), 0)),
            num_output_tokens=len(ids),
        )
