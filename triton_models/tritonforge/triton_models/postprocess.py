"""Postprocessing logic: token ids from the engine -> exact text deltas, counts, finish reason.

The ensemble calls postprocessing once per engine response, with the engine's outputs only
(Triton refuses a step fed both by a decoupled model and by earlier steps). Detokenization
state lives here, keyed by the request id (ensembles pass the client's id to every step; the
tritonforge clients always send one), so streamed pieces concatenate to exactly the text of a
non-streamed request (see ``detokenize``). State is keyed by the engine's own request key
when the engine sends one (two clients may send the same id), else by the request id, and
within a request per sequence (``num_return_sequences``; responses carry their
``sequence_index``). A sequence's state is dropped when it finishes, the request's when all
its sequences have; a cancelled request's state goes at once, every sequence's; and the
whole is bounded (least recently used request first) in case a request's end is never
seen. A request without either is decoded chunk by chunk; tritonforge's engine cuts chunks
on character boundaries, so that is exact for byte-level BPE tokenizers too.

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

Each sequence of a request is followed on its own (the facts say how many there are, and
the request's state and facts go when the last of them ends). The engine's
``output_log_probs`` (asked with ``return_log_probs``) travel with their tokens through the
stop-word hold-back: a held token's log-probability goes out with it, a stop word's is
dropped with it.
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
    """One sequence of a request on its way to text."""

    detok: IncrementalDetokenizer
    tokens: int = 0
    stopper: StopMatcher | None = None  # C++ path: the request's stop words, with hold-back
    held_lp: list[float] = field(default_factory=list)  # log-probabilities of what it holds
    generated: int = 0
    echo_left: int = 0  # prompt tokens still to come back (exclude_input_in_output false)


@dataclass
class _Request:
    """One request: its sequences' states (num_return_sequences of them), and on the C++
    path the facts preprocessing left for it and the sequences that have ended."""

    rid: str  # its key in the postprocessor's table (see Postprocessor.state_id)
    client_id: str
    facts: RequestFacts | None = None  # C++ path: what preprocessing completed it with
    seqs: dict[int, _State] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
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
        """The response's tensors: all seven on a sequence's last response (it has a finish
        reason); before it only ``text_output`` and ``num_output_tokens``, with
        ``sequence_index`` when not 0 and the log-probabilities when asked for -- each
        tensor costs tritonserver and the client work once per streamed response, and a
        client reads an absent output as its default (``contract.ENSEMBLE_OUTPUTS``)."""
        out = {
            "text_output": np.array([[self.text.encode("utf-8")]], dtype=object),
            "num_output_tokens": np.array([[self.num_output_tokens]], dtype=np.int32),
        }
        last = bool(self.finish_reason)
        if last:
            out["finish_reason"] = np.array([[self.finish_reason.encode("utf-8")]], dtype=object)
            out["num_input_tokens"] = np.array([[self.num_input_tokens]], dtype=np.int32)
        if last or self.sequence_index:
            out["sequence_index"] = np.array([[self.sequence_index]], dtype=np.int32)
        if last or self.logprobs:
            out["output_log_probs"] = np.array([self.logprobs], dtype=np.float32).reshape(1, len(self.logprobs))
            out["output_top_log_probs"] = np.array([[self.top.encode("utf-8")]], dtype=object)
        return out


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
        self._requests: OrderedDict[str, _Request] = OrderedDict()
        self.finished: Callable[[str], None] | None = None  # told each finish reason answered

    @property
    def open_requests(self) -> int:
        """Requests holding state (all their sequences count as one)."""
        return len(self._requests)

    @staticmethod
    def request_key(inputs: Mapping[str, np.ndarray | None]) -> int:
        """The engine's own key of the request these inputs belong to (0: none sent)."""
        return int(scalar(inputs.get("engine_request_key"), 0) or 0)

    @staticmethod
    def sequence_index(inputs: Mapping[str, np.ndarray | None]) -> int:
        """Which of the request's num_return_sequences these inputs carry (absent: 0, as the
        C++ backend leaves it out for one sequence)."""
        return int(scalar(inputs.get("engine_sequence_index"), 0) or 0)

    @classmethod
    def state_id(cls, inputs: Mapping[str, np.ndarray | None], request_id: str) -> str:
        """Whose state: the engine's request key, or the request id where the engine sends
        none (every sequence of a request shares it)."""
        return cls._state_of(cls.request_key(inputs), request_id)

    @staticmethod
    def _state_of(key: int, request_id: str) -> str:
        """:meth:`state_id` from the request key already read."""
        return f"key:{key}" if key else request_id

    def cancel_check_due(self, state_id: str, every: float) -> bool:
        """Whether to ask Triton if a request of the stream ``state_id`` (:meth:`state_id`)
        was cancelled (an IPC round trip): for a stream's first request, and then at most
        every ``every`` seconds per stream -- once a client has left, Triton marks each later
        request of its stream cancelled, so one of them is seen within ``every`` seconds."""
        req = self._requests.get(state_id)
        if req is None:
            return True
        now = time.monotonic()
        if now - req.cancel_checked < every:
            return False
        req.cancel_checked = now
        return True

    def forget(self, inputs: Mapping[str, np.ndarray | None], request_id: str = "") -> None:
        """Drop a request's state, every sequence's at once (it was cancelled: no final
        response will come for any of them)."""
        self._requests.pop(self.state_id(inputs, request_id), None)
        if self.drop_facts is not None and request_id and not self.request_key(inputs):
            self.drop_facts(request_id)

    def _derive(self, req: _Request, state: _State, ids: list[int],
                lps: list[float] | None) -> tuple[list[int], list[float] | None, str]:
        """The C++ path: this response's ids to decode (with their log-probabilities, when
        the engine sent them) and its finish reason ("" while the sequence runs), from the
        request's facts (see the module docstring)."""
        f = req.facts
        assert f is not None
        echo = min(len(ids), state.echo_left)
        state.echo_left -= echo
        prompt, new = ids[:echo], ids[echo:]
        new_lps = None if lps is None else lps[echo:]
        hit_end = bool(new) and f.end_id is not None and new[-1] == f.end_id
        if hit_end:
            new = new[:-1]
            new_lps = None if new_lps is None else new_lps[:len(new)]
        state.generated += len(new) + int(hit_end)
        reason, stopped = "", False
        if state.stopper is not None:
            state.held_lp.extend(new_lps or [0.0] * len(new))
            new, stopped = state.stopper.feed(new)
            new_lps = state.held_lp[:len(new)] if lps is not None else None
            del state.held_lp[:len(new)]
            if stopped:
                state.held_lp.clear()  # the stop word's, dropped with it
        if hit_end or stopped or not ids or not f.streaming:
            reason = FinishReason.STOP.value
        if state.generated >= f.max_tokens and not (hit_end or stopped):
            reason = FinishReason.LENGTH.value
        if reason and state.stopper is not None and not stopped:
            new += state.stopper.flush()
            if new_lps is not None:
                new_lps += state.held_lp
            state.held_lp.clear()
        out_lps = None if new_lps is None else [0.0] * len(prompt) + new_lps
        return prompt + new, out_lps, reason

    @staticmethod
    def _engine_logprobs(inputs: Mapping[str, np.ndarray | None], n_ids: int) -> list[float] | None:
        """The engine's log-probabilities for the ``n_ids`` tokens of its response, aligned to
        them (a shorter list is taken to skip an echoed prompt at the front); ``None`` when
        the engine sent none (not asked for)."""
        arr = inputs.get("engine_output_log_probs")
        if arr is None or arr.size == 0:
            return None
        lps = [float(v) for v in arr.reshape(-1)[:n_ids]]
        return [0.0] * (n_ids - len(lps)) + lps

    def _logprobs(self, inputs: Mapping[str, np.ndarray | None], ids: list[int],
                  lps: list[float] | None) -> dict[str, Any]:
        """The log-probability fields of a result for ``ids`` (the tokens it carries) with
        their log-probabilities ``lps``; empty when the engine sent none."""
        if lps is None or not ids:
            return {}
        raw = scalar(inputs.get("engine_top_log_probs"), "") or ""
        alts: list[Any] = json.loads(raw) if raw else [[] for _ in ids]
        top = [{"token": self.decode([tok]), "top": [[self.decode([int(t)]), float(lp)] for t, lp in alt]}
               for tok, alt in zip(ids, alts)]
        return {"logprobs": tuple(lps[: len(ids)]), "top": json.dumps(top, ensure_ascii=False)}

    def _request(self, rid: str, client_id: str, derive: bool) -> _Request:
        """The request whose state is ``rid`` (made on its first response, the facts read
        then on the C++ path), most recently used last; the least recently used go past
        ``max_states``."""
        req = self._requests.get(rid)
        if req is None:
            req = _Request(rid, client_id,
                           self.facts(client_id) if derive and self.facts is not None else None)
            self._requests[rid] = req
            while len(self._requests) > self.max_states:
                self._requests.popitem(last=False)
        else:
            self._requests.move_to_end(rid)
        return req

    def _sequence(self, req: _Request, index: int) -> _State:
        state = req.seqs.get(index)
        if state is None:
            state = req.seqs[index] = _State(IncrementalDetokenizer(self.decode))
            f = req.facts
            if f is not None:
                if f.stop_words:
                    state.stopper = StopMatcher([list(w) for w in f.stop_words])
                if not f.exclude_input:
                    state.echo_left = f.n_input
        return state

    def process(self, inputs: Mapping[str, np.ndarray | None], request_id: str = "") -> PostResult:
        ids_arr = inputs["output_ids"]
        assert ids_arr is not None
        lengths = inputs.get("sequence_length")
        while ids_arr.ndim > 1:  # [batch, beam, tokens] -> first beam of the one sequence
            ids_arr = ids_arr[0]
        n = int(scalar(lengths, len(ids_arr)))
        raw = [int(t) for t in ids_arr[: max(0, min(n, len(ids_arr)))]]
        lps = self._engine_logprobs(inputs, len(raw))
        ids = raw
        hit_end = bool(ids) and self.end_id is not None and ids[-1] == self.end_id
        if hit_end:  # the C++ backend leaves end_id out; an engine that includes it is trimmed
            ids = ids[:-1]
        reason = str(scalar(inputs.get("engine_finish_reason"), "") or "")
        client_id = request_id
        seq = self.sequence_index(inputs)
        key = self.request_key(inputs)
        rid = self._state_of(key, client_id)
        derive = (not reason and self.facts is not None and bool(client_id)
                  and not key)  # the C++ engine: no reason, no key
        if not reason and hit_end:
            reason = FinishReason.STOP.value
        n_input = int(scalar(inputs.get("engine_num_input_tokens"), -1))

        if not rid:
            text = self.decode(ids)
            if reason:  # a cut-off multi-byte character is dropped (see IncrementalDetokenizer)
                text = text.rstrip("\ufffd")
            return PostResult(text, reason, n_input, len(ids), **self._logprobs(inputs, ids, lps),
                              sequence_index=seq)
        req = self._request(rid, client_id, derive)
        state = self._sequence(req, seq)
        if req.facts is not None:
            ids, lps, reason = self._derive(req, state, raw, lps)  # end_id: the request's
            if n_input < 0:
                n_input = req.facts.n_input
        state.tokens += len(ids)
        text = state.detok.push(ids)
        if reason:
            text += state.detok.finish()
            # a cancelled (or failed) request ends every sequence: the engine sends no more
            self._end(req, seq, whole=reason in (FinishReason.CANCELLED.value, FinishReason.ERROR.value))
            if self.finished is not None:
                self.finished(reason)
        return PostResult(text, reason, n_input, len(ids), **self._logprobs(inputs, ids, lps),
                          sequence_index=seq)

    def _end(self, req: _Request, seq: int, *, whole: bool = False) -> None:
        """Sequence ``seq`` of ``req`` has answered its last response: its state goes; the
        request's goes (with its facts) once every sequence it asked for has ended -- on the
        C++ path the facts say how many, elsewhere a request without a live sequence holds
        nothing worth keeping -- or at once when ``whole`` (the request itself ended)."""
        req.seqs.pop(seq, None)
        req.ended.add(seq)
        if not whole and req.facts is not None and len(req.ended) < req.facts.n:
            return
        if not whole and req.facts is None and req.seqs:
            return
        if self._requests.get(req.rid) is req:
            del self._requests[req.rid]
        if req.facts is not None and self.drop_facts is not None:
            self.drop_facts(req.client_id)
