"""What ``Client`` and ``AsyncClient`` share, with no I/O.

Default merging, request validation, wire-request building (per protocol), model
discovery, retry backoff, deadlines, and turning decoded responses into ``Chunk`` and
``Completion`` objects all live here; the two clients only add the I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final, Literal

from tritonforge import contract
from tritonforge.clients import _wire
from tritonforge.clients._models import (
    USE_CLIENT_DEFAULT,
    Choice,
    Chunk,
    Completion,
    Request,
    RequestOverrides,
    TimeoutTypes,
    TokenLogprob,
)
from tritonforge.clients.exceptions import (
    Cancelled,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    Timeout,
)

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_TIMEOUT",
    "BaseClient",
    "ModelInfo",
    "Protocol",
    "Recorder",
    "pick_ensemble",
]

Protocol = Literal["grpc", "http"]
DEFAULT_PORTS: Final[dict[str, int]] = {"grpc": 8001, "http": 8000}
DEFAULT_TIMEOUT: Final = 300.0
"""Default whole-request deadline, seconds."""
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
ENSEMBLE_PLATFORM: Final = "ensemble"
SYNC_SUFFIX: Final = "_sync"

RequestInput = Request | str | None


@dataclass(frozen=True)
class ModelInfo:
    """One entry of the server's model repository index."""

    name: str
    version: str
    state: str
    reason: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "READY"


def pick_ensemble(platforms: dict[str, str]) -> str:
    """The one ensemble to talk to, given ``{ready model name: platform}``.

    A ``<name>_sync`` twin of another ensemble (the non-decoupled variant) does not count
    as a second candidate. Raises :class:`ModelNotReady` listing the candidates otherwise.
    """
    ensembles = sorted(n for n, p in platforms.items() if p == ENSEMBLE_PLATFORM)
    main = [n for n in ensembles if not (n.endswith(SYNC_SUFFIX) and n[: -len(SYNC_SUFFIX)] in ensembles)]
    if len(main) == 1:
        return main[0]
    if not main:
        listed = ", ".join(sorted(platforms)) or "none"
        raise ModelNotReady(
            f"no ready ensemble model to talk to (ready models: {listed}); pass a model name"
        )
    raise ModelNotReady(
        f"{len(main)} ensembles are served ({', '.join(main)}); pass the model name to use"
    )


def _local_admin_key(url: str) -> str | None:
    """``$TRITONFORGE_ADMIN_KEY``, else the key a local ``serve`` published for this port."""
    from tritonforge.runtime.adminkey import local_key

    return local_key(url)


def discovery_forbidden(exc: Forbidden) -> ModelNotReady:
    """The error when the repository index (needed to discover the model) is restricted."""
    from tritonforge.runtime.adminkey import ENV

    err = ModelNotReady(
        "cannot discover the model: the server restricts its repository index "
        f"({exc}) and no key for it is known here; pass the model name, or set {ENV} to the "
        "server's admin key (a `tritonforge serve` on this machine publishes its key to "
        "local commands itself)"
    )
    err.__cause__ = exc
    return err


def normalise_url(url: str | None, protocol: str) -> str:
    """``host:port`` (gRPC target) or ``http://host:port`` (HTTP base URL)."""
    if protocol not in DEFAULT_PORTS:
        raise InvalidRequest(f"protocol must be 'grpc' or 'http'; got {protocol!r}")
    if url is None:
        url = f"127.0.0.1:{DEFAULT_PORTS[protocol]}"
    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if protocol == "grpc":
        if scheme not in ("", "grpc"):
            raise InvalidRequest(f"a gRPC url is host:port; got {url!r}")
        return rest
    if scheme not in ("", "http", "https"):
        raise InvalidRequest(f"an HTTP url is host:port or http://host:port; got {url!r}")
    return f"{scheme or 'http'}://{rest}"


class Recorder:
    """Turns the decoded responses of one request into chunks, timings and a Completion."""

    def __init__(self, model: str, request: Request, timeout: float | None) -> None:
        self.model = model
        self.request = request
        self.timeout = timeout
        self.sent = time.perf_counter()
        self._prompt_tokens = 0
        self._tokens = 0
        self._first: float | None = None
        self._last: float | None = None
        self._gaps: list[float] = []
        # per sequence (Request.n): texts, finish reason, tokens, log-probabilities
        self._parts: dict[int, list[str]] = {0: []}
        self._finish: dict[int, contract.FinishReason] = {0: contract.FinishReason.NONE}
        self._seq_tokens: dict[int, int] = {0: 0}
        self._logprobs: dict[int, list[TokenLogprob]] = {0: []}
        self._index = 0
        self._end: float | None = None

    def restart(self) -> None:
        """Reset the send time (a retried attempt)."""
        self.sent = time.perf_counter()

    def remaining(self) -> float | None:
        """Seconds left before the deadline (``None``: no deadline)."""
        if self.timeout is None:
            return None
        return max(self.timeout - (time.perf_counter() - self.sent), 0.001)

    def check_deadline(self) -> None:
        if self.timeout is not None and time.perf_counter() - self.sent > self.timeout:
            raise Timeout(f"request did not finish within its timeout of {self.timeout:g} s")

    def add(self, event: _wire.Event) -> Chunk | None:
        """Record one response; the Chunk to yield, or ``None`` for an empty final response."""
        now = time.perf_counter()
        if event.prompt_tokens is not None:
            self._prompt_tokens = event.prompt_tokens
        if event.finish_reason is contract.FinishReason.CANCELLED:
            # The server ends a cancelled stream with a final response, not an error (an
            # ensemble error there would leak in Triton 2.51; see contract.ENGINE_EXTRA_OUTPUTS).
            raise Cancelled("request cancelled on the server (a stop for it, or the server "
                            "shutting down)")
        seq = event.sequence
        self._parts.setdefault(seq, [])
        self._logprobs.setdefault(seq, [])
        self._seq_tokens.setdefault(seq, 0)
        self._finish.setdefault(seq, contract.FinishReason.NONE)
        if event.finish_reason is not contract.FinishReason.NONE:
            self._finish[seq] = event.finish_reason
        carries = bool(event.text) or event.tokens > 0
        if not carries and event.finish_reason is contract.FinishReason.NONE:
            return None
        if carries:
            if self._first is None:
                self._first = now
            elif self._last is not None:
                self._gaps.append(now - self._last)
            self._last = now
            self._parts[seq].append(event.text)
            self._tokens += event.tokens
            self._seq_tokens[seq] += event.tokens
        self._logprobs[seq].extend(event.logprobs)
        chunk = Chunk(event.text, event.tokens, self._index, now - self.sent, event.finish_reason,
                      event.logprobs, seq)
        self._index += 1
        return chunk

    def finish(self) -> Completion:
        """The Completion, once the final response has arrived."""
        if self._end is None:
            self._end = time.perf_counter()
        latency = self._end - self.sent
        ttft = None if self._first is None else self._first - self.sent
        itl = None
        if ttft is not None and self._tokens > 1:
            itl = (latency - ttft) / (self._tokens - 1)
        choices = tuple(Choice(i, "".join(self._parts[i]), self._finish[i], self._seq_tokens[i],
                               tuple(self._logprobs[i])) for i in sorted(self._parts))
        return Completion(
            text=choices[0].text,
            finish_reason=choices[0].finish_reason,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=self._tokens,
            ttft=ttft,
            itl=itl,
            inter_token_latencies=tuple(self._gaps),
            latency=latency,
            chunks=self._index,
            model=self.model,
            request_id=self.request.request_id,
            logprobs=choices[0].logprobs,
            choices=choices,
        )


class BaseClient:
    """Configuration, request building and response parsing shared by both clients."""

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: Protocol = "grpc",
        model: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        connect_retries: int = 3,
        admin_key: str | None = None,
        check_requests: bool = True,
    ) -> None:
        self.protocol: Protocol = protocol
        self.url = normalise_url(url, protocol)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        if connect_retries < 0:
            raise InvalidRequest(f"connect_retries must be >= 0; got {connect_retries}")
        self.connect_retries = connect_retries
        self._model = model
        self._admin_key = admin_key if admin_key is not None else _local_admin_key(self.url)
        self.check_requests = check_requests

    # -- request building ------------------------------------------------------------
    def build_request(self, req: RequestInput, overrides: RequestOverrides) -> Request:
        """Merge a Request / prompt with per-call overrides and validate the result."""
        if isinstance(req, Request):
            request = req.replace(**overrides) if overrides else req
        elif isinstance(req, str) or req is None:
            fields: dict[str, Any] = dict(overrides)
            if req is not None:
                fields["prompt"] = req
            request = Request(**fields)
        else:
            raise InvalidRequest(f"expected a Request or a prompt string; got {type(req).__name__}")
        if self.check_requests:
            request.validate()
        return request

    def timeout_for(self, request: Request) -> float | None:
        t: TimeoutTypes = request.timeout
        return self.timeout if t is USE_CLIENT_DEFAULT else t

    def wire_request(self, request: Request, model: str) -> Any:
        """The transport's request object: a ``ModelInferRequest`` or an HTTP JSON body."""
        if self.protocol == "grpc":
            return _wire.grpc_request(request, model)
        return _wire.http_body(request)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before connection retry ``attempt`` (0-based): 0.25, 0.5, 1 ... <= 2
        (together longer than gRPC's 1 s reconnect back-off, so a restarted server is found)."""
        return float(min(0.25 * (2**attempt), 2.0))

    def can_retry(self, attempt: int) -> bool:
        return attempt < self.connect_retries

    @property
    def model(self) -> str | None:
        """The model name in use (``None`` until discovered when none was given)."""
        return self._model
