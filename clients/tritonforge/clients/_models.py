"""The typed request and response objects of the clients (no I/O)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from tritonforge import contract
from tritonforge.clients.exceptions import InvalidRequest

__all__ = [
    "GUIDE_FIELDS",
    "REQUEST_TENSORS",
    "USE_CLIENT_DEFAULT",
    "Choice",
    "Chunk",
    "Completion",
    "Message",
    "Request",
    "RequestOverrides",
    "TimeoutTypes",
    "TokenLogprob",
    "UseClientDefault",
]


class UseClientDefault(enum.Enum):
    """Type of :data:`USE_CLIENT_DEFAULT`: "not passed", as opposed to an explicit ``None``."""

    USE_CLIENT_DEFAULT = "USE_CLIENT_DEFAULT"

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


USE_CLIENT_DEFAULT: Final = UseClientDefault.USE_CLIENT_DEFAULT
"""Sentinel: take the client's default (``timeout=None`` instead means "no deadline")."""

TimeoutTypes = float | None | UseClientDefault


class Message(TypedDict):
    """One chat message: ``{"role": "user", "content": "..."}``."""

    role: str
    content: str


# Request field -> ensemble input, from the contract's request-parameter table (the
# fields of Request and RequestOverrides are asserted equal to it below, at import).
REQUEST_TENSORS: Final[dict[str, str]] = {
    p.client: p.name for p in contract.REQUEST_PARAMETERS if p.client is not None
}
_WORD_FIELDS: Final = frozenset(
    p.client for p in contract.REQUEST_PARAMETERS if p.kind == "words" and p.client
)
_NOT_PARAMETERS: Final = frozenset({"request_id", "timeout"})
# Structured-output fields -> their guide (contract.GUIDES): at most one per request, sent
# as the guided_decoding_guide_type / guided_decoding_guide inputs.
GUIDE_FIELDS: Final[dict[str, contract.Guide]] = {g.client: g for g in contract.GUIDES}


@dataclass(frozen=True)
class Request:
    """One generation request to the served ensemble.

    Exactly one of ``prompt`` (plain text) and ``messages`` (chat; the server applies the
    model's chat template) is given. Sampling fields left at ``None`` are not sent, so the
    server's defaults (from the deployment spec) apply. At most one structured-output field
    is given: ``json_schema`` (a dict or its JSON text), ``regex`` (matched in full),
    ``choice`` (a list of strings), ``grammar`` (EBNF) or ``json_object=True`` (any JSON
    object). ``logprobs=True`` returns each token's log-probability (``Chunk.logprobs``,
    ``Completion.logprobs``), ``top_logprobs=k`` also the k most likely tokens at each.
    ``n`` sequences come back as ``Completion.choices`` (chunks carry their ``sequence``).
    ``lora`` names one of the deployment's LoRA adapters (``Client.lora_adapters()``). ``timeout`` is the whole request's deadline in seconds: ``USE_CLIENT_DEFAULT``
    takes the client's, ``None`` means none.
    """

    prompt: str | None = None
    messages: Sequence[Mapping[str, object]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    seed: int | None = None
    stop: Sequence[str] | None = None
    bad_words: Sequence[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    n: int | None = None
    lora: str | None = None
    json_schema: Mapping[str, Any] | str | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    stream: bool = True
    request_id: str | None = None
    timeout: TimeoutTypes = field(default=USE_CLIENT_DEFAULT, compare=False)

    def __post_init__(self) -> None:
        # Normalise containers so a Request is immutable all the way down.
        if self.messages is not None and not isinstance(self.messages, (str, bytes)):
            msgs = tuple(dict(m) if isinstance(m, Mapping) else m for m in self.messages)
            object.__setattr__(self, "messages", msgs)
        for name in (*_WORD_FIELDS, "choice"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, bytes)):
                object.__setattr__(self, name, tuple(value))

    def replace(self, **changes: Any) -> Request:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def messages_json(self) -> str | None:
        """The ``messages`` input as sent on the wire (JSON), or ``None``."""
        if self.messages is None:
            return None
        return json.dumps([dict(m) for m in self.messages], ensure_ascii=False)

    def inputs(self) -> dict[str, Any]:
        """The ensemble inputs this request sends: tensor name -> Python value.

        Scalars stay scalars, word lists stay lists; absent (``None``) fields are left out.
        """
        out: dict[str, Any] = {}
        for fname, tensor in REQUEST_TENSORS.items():
            value: Any = self.messages_json() if fname == "messages" else getattr(self, fname)
            if value is None:
                continue
            out[tensor] = list(value) if fname in _WORD_FIELDS else value
        guides = self._guides()
        if guides:
            name, guide = guides[0]
            out.update(contract.encode_guide(guide, getattr(self, name)))
        return out

    def _guides(self) -> list[tuple[str, contract.Guide]]:
        """The structured-output fields given (``json_object=False`` is none)."""
        return [(name, g) for name, g in GUIDE_FIELDS.items()
                if getattr(self, name) is not None and getattr(self, name) is not False]

    def validate(self) -> None:
        """Check the request with the server's own bounds; raise :class:`InvalidRequest`.

        Uses ``contract.check_sampling`` and ``contract.parse_messages``, the functions the
        server's preprocessing model calls, so both sides accept exactly the same requests.
        """
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give exactly one of prompt (text) or messages (chat)")
        if self.prompt is not None:
            if not isinstance(self.prompt, str):
                raise InvalidRequest(f"prompt must be a string; got {type(self.prompt).__name__}")
            size = len(self.prompt.encode("utf-8"))
            if size > contract.LIMITS.max_prompt_bytes:
                raise InvalidRequest(
                    f"prompt must be at most {contract.LIMITS.max_prompt_bytes} bytes of UTF-8;"
                    f" got {size}"
                )
        if self.messages is not None:
            if isinstance(self.messages, (str, bytes)):
                raise InvalidRequest("messages must be a list of {role, content} objects")
            try:
                contract.parse_messages(self.messages_json() or "")
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(str(exc)) from None
        if not isinstance(self.stream, bool):
            raise InvalidRequest(f"stream must be true or false; got {self.stream!r}", param="stream")
        for name in _WORD_FIELDS:
            if isinstance(getattr(self, name), (str, bytes)):
                raise InvalidRequest(f"{name} must be a list of strings, not one string", param=name)
        t = self.timeout
        if not isinstance(t, UseClientDefault) and t is not None and (
            isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0
        ):
            raise InvalidRequest(f"timeout must be a positive number of seconds; got {self.timeout!r}")
        guides = self._guides()
        if len(guides) > 1:
            raise InvalidRequest("give at most one of " + ", ".join(GUIDE_FIELDS) + "; got "
                                 + ", ".join(n for n, _ in guides), param=guides[1][0])
        if self.json_object not in (None, True, False):
            raise InvalidRequest(f"json_object must be true or false; got {self.json_object!r}",
                                 param="json_object")
        try:
            values = {k: v for k, v in self.inputs().items() if contract.param(k).kind != "prompt"}
            contract.check_request_values(values)
        except contract.ParameterError as exc:
            param = exc.param
            if guides and param in (contract.GUIDE_INPUT, contract.GUIDE_TYPE_INPUT):
                param = guides[0][0]  # the field this request set
            raise InvalidRequest(str(exc), param=param) from None


class RequestOverrides(TypedDict, total=False):
    """Per-call overrides accepted as keyword arguments by ``complete``/``stream``/``chat``.

    A key that is absent keeps the request's value; ``None`` clears it (server default).
    """

    prompt: str | None
    messages: Sequence[Mapping[str, object]] | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    min_tokens: int | None
    seed: int | None
    stop: Sequence[str] | None
    bad_words: Sequence[str] | None
    presence_penalty: float | None
    frequency_penalty: float | None
    repetition_penalty: float | None
    logprobs: bool | None
    top_logprobs: int | None
    n: int | None
    lora: str | None
    json_schema: Mapping[str, Any] | str | None
    regex: str | None
    choice: Sequence[str] | None
    grammar: str | None
    json_object: bool | None
    stream: bool
    request_id: str | None
    timeout: TimeoutTypes


_fields = {f.name for f in dataclasses.fields(Request)} - _NOT_PARAMETERS
if _fields != set(REQUEST_TENSORS) | set(GUIDE_FIELDS) or set(RequestOverrides.__annotations__) - _NOT_PARAMETERS != _fields:
    raise ImportError(  # pragma: no cover - fails at import if the contract drifts
        "tritonforge.clients: Request fields differ from the contract's request parameters: "
        f"{sorted(_fields ^ (set(REQUEST_TENSORS) | set(GUIDE_FIELDS)))}"
    )


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability (``Request(logprobs=True)``) and, with
    ``top_logprobs=k``, the k most likely tokens at its position as ``(text, logprob)``,
    most likely first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """One streamed response.

    ``text`` is the new text (a delta), ``tokens`` the number of tokens this response
    carries, ``index`` its 0-based position in the stream, ``arrival`` the seconds since
    the request was sent, ``finish_reason`` empty (``FinishReason.NONE``) except on the
    last chunk.
    """

    text: str
    tokens: int
    index: int
    arrival: float
    finish_reason: contract.FinishReason = contract.FinishReason.NONE
    logprobs: tuple[TokenLogprob, ...] = ()  # of this chunk's tokens, when asked for
    sequence: int = 0  # which of the request's n sequences this chunk extends


@dataclass(frozen=True)
class Choice:
    """One of the ``n`` sequences of a finished generation (``Completion.choices``)."""

    index: int
    text: str
    finish_reason: contract.FinishReason
    tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Completion:
    """A finished generation with its timings (seconds; genai-perf's definitions).

    * ``ttft``: first chunk carrying text or tokens minus request send time (``None`` when
      nothing was generated).
    * ``itl``: (``latency`` - ``ttft``) / (``completion_tokens`` - 1), the inter-token
      latency summary (``None`` with fewer than two tokens).
    * ``inter_token_latencies``: the gaps between consecutive non-empty chunks.
    * ``latency``: end-to-end, request send to final response.
    """

    text: str
    finish_reason: contract.FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft: float | None
    itl: float | None
    inter_token_latencies: tuple[float, ...]
    latency: float
    chunks: int
    model: str
    request_id: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # of every generated token, when asked for
    choices: tuple[Choice, ...] = ()  # every sequence (Request.n); text etc. are the first's

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``finish_reason`` as its string value)."""
        out = dataclasses.asdict(self)
        out["finish_reason"] = self.finish_reason.value
        out["inter_token_latencies"] = list(self.inter_token_latencies)
        for choice in out["choices"]:
            choice["finish_reason"] = contract.FinishReason(choice["finish_reason"]).value
        return out
