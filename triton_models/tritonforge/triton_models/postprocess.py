"""Postprocessing logic: token ids from the engine -> exact text deltas, counts, finish reason.

The ensemble calls postprocessing once per engine response, with the engine's outputs only
(Triton refuses a step fed both by a decoupled model and by earlier steps). Detokenization
state lives here, keyed by the request id (ensembles pass the client's id to every step; the
tritonforge clients always send one), so streamed pieces concatenate to exactly the text of a
non-streamed request (see ``detokenize``). State is keyed by the engine's own request key
when the engine sends one (two clients may send the same id), else by the request id. It is
dropped when the request finishes or is cancelled, and bounded (least recently used first)
in case a request's end is never seen. A request without either is decoded chunk by chunk;
tritonforge's engine cuts chunks on character boundaries, so that is exact for byte-level
BPE tokenizers too.

The TensorRT-LLM C++ backend returns no finish reason (and no request key, and no prompt
length). For its requests postprocessing derives the finish reason itself from the facts
preprocessing left for the request id (``request_facts``), on every response:

* ``stop`` -- the response ends with the request's end_id (dropped from the text), or the
  generated ids end with one of its stop words (held back while they could still become one,
  never returned: the backend returns them), or a streamed response carries no token (the
  backend sends a token with every response but the last one, which it leaves empty when
  the generation ended at end_id, since end_id itself is not returned), or the request does
  not stream (its one response is the last one);
* ``length`` -- max_tokens generated;
* ``cancelled`` -- the client went away (see ``postprocessing_model``).

Either way a request's state (and its facts) is dropped on its last response.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonforge.contract import FinishReason
from tritonforge.triton_models.detokenize import Decoder, IncrementalDetokenizer
from tritonforge.triton_models.engine.request import StopMatcher
from tritonforge.triton_models.request_facts import RequestFacts

__all__ = ["PostResult", "Postprocessor", "scalar"]


@dataclass
class _State:
    detok: IncrementalDetokenizer
    tokens: int
    touched: float
    facts: RequestFacts | None = None  # C++ path: what preprocessing completed the request with
    stopper: StopMatcher | None = None
    generated: int = 0
    echo_left: int = 0  # prompt tokens still to come back (exclude_input_in_output false)
    derive: bool = field(default=False)
    cancel_checked: float = 0.0  # when the model last asked Triton whether it was cancelled


@dataclass(frozen=True)
class PostResult:
    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int
    logprobs: tuple[float, ...] = ()  # one per token of this response, when asked for
    top: str = ""  # output_top_log_probs (JSON), when asked for
    sequence_index: int = 0

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "text_output": np.array([[self.text.encode("utf-8")]], dtype=object),
            "finish_reason": np.array([[self.finish_reason.encode("utf-8")]], dtype=object),
            "num_input_tokens": np.array([[self.num_input_tokens]], dtype=np.int32),
            "num_output_tokens": np.array([[self.num_output_tokens]], dtype=np.int32),
            "sequence_index": np.array([[self.sequence_index]], dtype=np.int32),
            "output_log_probs": np.array([self.logprobs], dtype=np.float32).reshape(1, len(self.logprobs)),
            "output_top_log_probs": np.array([[self.top.encode("utf-8")]], dtype=object),
        }


def scalar(arr: np.ndarray | None, default: Any = None) -> Any:
    """The first element of a tensor as a Python value (STRING as text); ``default`` when
    absent or empty."""
    if arr is None or arr.size == 0:
        return default
    v = arr.reshape(-1)[0]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return v.item() if hasattr(v, "item") else v


class Postprocessor:
    def __init__(
        self,
        decode: Decoder,
        end_id: int | None = None,
        max_states: int = 65536,
        *,
        facts: Callable[[str], RequestFacts | None] | None = None,
        drop_facts: Callable[[str], None] | None = None,
    ) -> None:
        self.decode = decode
        self.end_id = end_id
        self.max_states = max_states
        self.facts = facts
        self.drop_facts = drop_facts
        self._states: OrderedDict[str, _State] = OrderedDict()
        self.finished: Callable[[str], None] | None = None  # told each finish reason answered

    @property
    def open_requests(self) -> int:
        return len(self._states)

    @staticmethod
    def request_key(inputs: Mapping[str, np.ndarray | None]) -> int:
        """The engine's own key of the request these inputs belong to (0: none sent)."""
        return int(scalar(inputs.get("engine_request_key"), 0) or 0)

    @classmethod
    def state_id(cls, inputs: Mapping[str, np.ndarray | None], request_id: str) -> str:
        """Whose detokenizer state: the engine's request key (or the request id) and, for
        the sequences after the first (num_return_sequences), the sequence index."""
        key = cls.request_key(inputs)
        seq = int(scalar(inputs.get("engine_sequence_index"), 0) or 0)
        base = f"key:{key}" if key else request_id
        return f"{base}:{seq}" if seq and base else base

    def cancel_check_due(self, inputs: Mapping[str, np.ndarray | None], request_id: str,
                         every: float) -> bool:
        """Whether to ask Triton if this request was cancelled (an IPC round trip): for a
        stream's first request, and then at most every ``every`` seconds per stream -- once a
        client has left, Triton marks each later request of its stream cancelled, so one of
        them is seen within ``every`` seconds."""
        state = self._states.get(self.state_id(inputs, request_id))
        if state is None:
            return True
        now = time.monotonic()
        if now - state.cancel_checked < every:
            return False
        state.cancel_checked = now
        return True

    def forget(self, inputs: Mapping[str, np.ndarray | None], request_id: str = "") -> None:
        """Drop a request's state (it was cancelled: no final response will come)."""
        self._states.pop(self.state_id(inputs, request_id), None)
        if self.drop_facts is not None and request_id and not self.request_key(inputs):
            self.drop_facts(request_id)

    def _derive(self, state: _State, ids: list[int]) -> tuple[list[int], str]:
        """The C++ path: this response's ids to decode and its finish reason ("" while the
        request runs), from the request's facts (see the module docstring)."""
        f = state.facts
        assert f is not None
        echo = min(len(ids), state.echo_left)
        state.echo_left -= echo
        prompt, new = ids[:echo], ids[echo:]
        hit_end = bool(new) and f.end_id is not None and new[-1] == f.end_id
        if hit_end:
            new = new[:-1]
        state.generated += len(new) + int(hit_end)
        reason, stopped = "", False
        if state.stopper is not None:
            new, stopped = state.stopper.feed(new)
        if hit_end or stopped or not ids or not f.streaming:
            reason = FinishReason.STOP.value
        if state.generated >= f.max_tokens and not (hit_end or stopped):
            reason = FinishReason.LENGTH.value
        if reason and state.stopper is not None and not stopped:
            new += state.stopper.flush()
        return prompt + new, reason

    def _logprobs(self, inputs: Mapping[str, np.ndarray | None], ids: list[int]) -> dict[str, Any]:
        """The log-probability fields of a result for ``ids`` (the tokens it carries, the
        first ones of the engine's output_ids): empty unless the engine sent them."""
        arr = inputs.get("engine_output_log_probs")
        if arr is None or arr.size == 0 or not ids:
            return {}
        lps = tuple(float(v) for v in arr.reshape(-1)[: len(ids)])
        raw = scalar(inputs.get("engine_top_log_probs"), "") or ""
        alts: list[Any] = json.loads(raw) if raw else [[] for _ in ids]
        top = [{"token": self.decode([tok]), "top": [[self.decode([int(t)]), float(lp)] for t, lp in alt]}
               for tok, alt in zip(ids, alts)]
        return {"logprobs": lps, "top": json.dumps(top, ensure_ascii=False)}

    def process(self, inputs: Mapping[str, np.ndarray | None], request_id: str = "") -> PostResult:
        ids_arr = inputs["output_ids"]
        assert ids_arr is not None
        lengths = inputs.get("sequence_length")
        while ids_arr.ndim > 1:  # [batch, beam, tokens] -> first beam of the one sequence
            ids_arr = ids_arr[0]
        n = int(scalar(lengths, len(ids_arr)))
        ids = [int(t) for t in ids_arr[: max(0, min(n, len(ids_arr)))]]
        hit_end = bool(ids) and self.end_id is not None and ids[-1] == self.end_id
        if hit_end:  # the C++ backend leaves end_id out; an engine that includes it is trimmed
            ids = ids[:-1]
        reason = str(scalar(inputs.get("engine_finish_reason"), "") or "")
        client_id = request_id
        derive = (not reason and self.facts is not None and bool(client_id)
                  and not self.request_key(inputs))  # the C++ engine: no reason, no key
        if not reason and hit_end:
            reason = FinishReason.STOP.value
        n_input = int(scalar(inputs.get("engine_num_input_tokens"), -1))
        request_id = self.state_id(inputs, request_id)

        if not request_id:
            text = self.decode(ids)
            if reason:  # a cut-off multi-byte character is dropped (see IncrementalDetokenizer)
                text = text.rstrip("\ufffd")
            return PostResult(text, reason, n_input, len(ids), **self._logprobs(inputs, ids),
                              sequence_index=int(scalar(inputs.get("engine_sequence_index"), 0) or 0))
        now = time.monotonic()
        state = self._states.get(request_id)
        if state is None:
            state = _State(IncrementalDetokenizer(self.decode), 0, now)
            if derive and self.facts is not None:
                state.facts = self.facts(client_id)
                state.derive = state.facts is not None
                if state.facts is not None:
                    if state.facts.stop_words:
                        state.stopper = StopMatcher([list(w) for w in state.facts.stop_words])
                    if not state.facts.exclude_input:
                        state.echo_left = state.facts.n_input
            self._states[request_id] = state
            while len(self._states) > self.max_states:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(request_id)
            state.touched = now
        if state.derive and state.facts is not None:
            ids = [int(t) for t in ids_arr[: max(0, min(n, len(ids_arr)))]]  # end_id: the request's
            ids, reason = self._derive(state, ids)
            if n_input < 0:
                n_input = state.facts.n_input
        logprobs = {} if state.derive else self._logprobs(inputs, ids)
        state.tokens += len(ids)
        text = state.detok.push(ids)
        if reason:
            text += state.detok.finish()
            self._states.pop(request_id, None)
            if state.derive and self.drop_facts is not None:
                self.drop_facts(client_id)
            if self.finished is not None:
                self.finished(reason)
        return PostResult(text, reason, n_input, len(ids), **logprobs,
                          sequence_index=int(scalar(inputs.get("engine_sequence_index"), 0) or 0))
