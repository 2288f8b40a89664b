"""Typed clients for a tritonforge deployment served by Triton Inference Server.

::

    from tritonforge.clients import Client

    with Client("127.0.0.1:8001") as client:          # gRPC; protocol="http" for HTTP
        print(client.complete("Once upon a time", max_tokens=32).text)
        with client.stream("Tell me a story", max_tokens=64) as s:
            for chunk in s:
                print(chunk.text, end="", flush=True)
        print(s.completion.ttft)

``AsyncClient`` is the asyncio twin (``await client.complete(...)``,
``async with client.stream(...) as s: async for chunk in s``).
"""

from tritonforge.clients._base import ModelInfo
from tritonforge.clients._client import AsyncClient, AsyncStream, Client, Stream
from tritonforge.clients._models import (
    USE_CLIENT_DEFAULT,
    Choice,
    Chunk,
    Completion,
    Message,
    Request,
    RequestOverrides,
    TokenLogprob,
    UseClientDefault,
)
from tritonforge.clients.exceptions import (
    Cancelled,
    EngineError,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    Overloaded,
    ProtocolError,
    ServerError,
    ServerUnavailable,
    StreamConsumed,
    StreamError,
    Timeout,
    TritonForgeError,
)
from tritonforge.contract import ErrorKind, FinishReason

__all__ = [
    "USE_CLIENT_DEFAULT",
    "AsyncClient",
    "AsyncStream",
    "Cancelled",
    "Choice",
    "Chunk",
    "Client",
    "Completion",
    "EngineError",
    "ErrorKind",
    "FinishReason",
    "Forbidden",
    "InvalidRequest",
    "Message",
    "ModelInfo",
    "ModelNotReady",
    "Overloaded",
    "ProtocolError",
    "Request",
    "RequestOverrides",
    "ServerError",
    "ServerUnavailable",
    "Stream",
    "StreamConsumed",
    "StreamError",
    "Timeout",
    "TokenLogprob",
    "TritonForgeError",
    "UseClientDefault",
]
