"""Every error the tritonforge clients raise.

Foreign errors (``grpc.RpcError``, ``httpx.HTTPError``, SSE decoding errors) never escape
the clients: each transport translates them in one place and chains the original with
``raise ... from exc``.  Errors the server reports inside a successful reply (a
``ModelStreamInfer`` response's ``error_message``, an SSE ``error`` event after HTTP 200)
become the same types.

Errors the server's tritonforge models report carry a machine-readable kind
(``tritonforge.contract.ErrorKind``) and, where a request parameter is at fault, its name:
every error here has ``.kind`` and ``.param`` (``None`` when the server did not say).

The tree::

    TritonForgeError
    ├── ServerUnavailable   the server cannot be reached (refused, reset, stopped, shutting down)
    │   └── Overloaded      the server is at capacity (its queue is full): retry later
    ├── Timeout             the request's deadline passed before it finished
    ├── ModelNotReady       the model is unknown, unloaded or not ready; or no single
    │                       ensemble could be discovered when no model was named
    ├── InvalidRequest      the request was refused, by the client-side check or by the
    │                       server (``.server_message`` holds the server's words)
    ├── ServerError         the server failed while handling a valid request
    │   └── EngineError     the inference engine itself failed
    ├── Forbidden           the server refused an API it restricts (admin key missing/wrong)
    ├── Cancelled           the request was cancelled (by ``Stream.close()`` from elsewhere,
    │                       or by the server) before it finished
    ├── ProtocolError       a reply broke the serving contract (missing outputs, not SSE, ...)
    └── StreamError         a ``Stream`` was used wrongly
        └── StreamConsumed  iterating a stream that was already consumed or closed

Retries: only ``ServerUnavailable`` raised before the first response of a request is
retried (``connect_retries`` times, with backoff); nothing is retried once a stream has
produced a chunk.
"""

from __future__ import annotations

from tritonforge.contract import ErrorKind

__all__ = [
    "Cancelled",
    "EngineError",
    "Forbidden",
    "InvalidRequest",
    "ModelNotReady",
    "Overloaded",
    "ProtocolError",
    "ServerError",
    "ServerUnavailable",
    "StreamConsumed",
    "StreamError",
    "Timeout",
    "TritonForgeError",
]


class TritonForgeError(Exception):
    """Base class of every error raised by the tritonforge clients.

    ``kind`` is the error kind the server reported (``None`` for errors the server did not
    classify, and for errors raised on the client side); ``param`` the request parameter at
    fault, when the server named one.
    """

    def __init__(self, message: str = "", *, kind: ErrorKind | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


class ServerUnavailable(TritonForgeError):
    """The server could not be reached: connection refused or reset, server stopped."""


class Overloaded(ServerUnavailable):
    """The server refused the request because it is at capacity (queue full): retry later."""


class Timeout(TritonForgeError):
    """The request's deadline (``timeout``) passed before the request finished."""


class ModelNotReady(TritonForgeError):
    """The model is unknown, unloaded or not ready, or no single ensemble was found."""


class InvalidRequest(TritonForgeError):
    """The request was refused as invalid.

    ``server_message`` is the server's own message when the server refused it, ``None``
    when the client-side check (the same bounds as the server's) refused it before any I/O.
    """

    def __init__(
        self,
        message: str,
        *,
        server_message: str | None = None,
        kind: ErrorKind | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, kind=kind, param=param)
        self.server_message = server_message


class ServerError(TritonForgeError):
    """The server failed while handling the request (an internal error, not the request's fault)."""


class EngineError(ServerError):
    """The inference engine failed while generating (not the request's fault)."""


class Forbidden(TritonForgeError):
    """The server restricts this API (e.g. the repository index) and the admin key was missing
    or wrong (Triton's ``--http-restricted-api`` / ``--grpc-restricted-protocol``)."""


class Cancelled(TritonForgeError):
    """The request was cancelled before it finished."""


class ProtocolError(TritonForgeError):
    """A reply did not follow the serving contract."""


class StreamError(TritonForgeError):
    """A stream object was used wrongly."""


class StreamConsumed(StreamError):
    """The stream was already iterated to its end, or closed; a stream can be read once."""
