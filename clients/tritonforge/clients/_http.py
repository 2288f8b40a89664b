"""HTTP transports: httpx (connection reuse) + httpx-sse for ``generate_stream``.

One ``httpx.Client`` / ``httpx.AsyncClient`` serves every request of a tritonforge client.
A request is ``POST /v2/models/<m>/generate_stream`` answered by SSE events; closing the
response closes the connection, which ends the request on the server. ``httpx`` and SSE
errors are translated in :func:`translate` only; HTTP error statuses in :func:`status_error`.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import httpx
from httpx_sse import EventSource, ServerSentEvent, SSEError
from tritonforge.clients import _wire
from tritonforge.clients._base import ModelInfo
from tritonforge.clients.exceptions import (
    ProtocolError,
    ServerError,
    ServerUnavailable,
    Timeout,
    TritonForgeError,
)

__all__ = ["AsyncHttpCall", "AsyncHttpTransport", "HttpCall", "HttpTransport", "status_error", "translate"]

_LIMITS: Final = httpx.Limits(max_connections=None, max_keepalive_connections=256)
_SSE_HEADERS: Final = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


def translate(exc: Exception) -> TritonForgeError:
    """The one place an httpx / SSE error becomes a tritonforge error."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return Timeout(f"request timed out: {exc or type(exc).__name__}")
    if isinstance(exc, (httpx.TransportError, httpx.StreamClosed)):
        return ServerUnavailable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if isinstance(exc, SSEError):
        return ProtocolError(f"not an SSE stream: {exc}")
    return ProtocolError(f"HTTP error: {exc}")


def error_text(body: str) -> str:
    """The server's message in an error body: Triton sends ``{"error": "..."}``."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return body
    return str(obj["error"]) if isinstance(obj, dict) and "error" in obj else body


def status_error(status: int, message: str) -> TritonForgeError:
    """The typed error for a non-2xx reply carrying the server's ``message``."""
    kind: _wire.Status | None = {400: "invalid", 403: "forbidden", 404: "not_found",
                                 499: "cancelled", 503: "unavailable"}.get(status)
    if kind is None and status >= 500:
        kind = "internal"
    if kind is None:
        return ServerError(f"HTTP {status}: {message}")
    return _wire.server_error(message, status=kind)


def _is_sse(response: httpx.Response) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "")


def _read_error(response: httpx.Response) -> TritonForgeError:
    """Read a refused reply (when the first response is an error, Triton sends it as an
    SSE event with a 4xx status) and close it."""
    try:
        if _is_sse(response):
            parts = [error_text(e.data) for e in EventSource(response).iter_sse() if e.data]
            message = "; ".join(parts)
        else:
            message = error_text(response.read().decode("utf-8", errors="replace"))
    except (httpx.HTTPError, httpx.StreamError, SSEError) as exc:
        raise translate(exc) from exc
    finally:
        response.close()
    return status_error(response.status_code, message)


async def _aread_error(response: httpx.Response) -> TritonForgeError:
    """Async twin of :func:`_read_error`."""
    try:
        if _is_sse(response):
            parts = [error_text(e.data) async for e in EventSource(response).aiter_sse() if e.data]
            message = "; ".join(parts)
        else:
            message = error_text((await response.aread()).decode("utf-8", errors="replace"))
    except (httpx.HTTPError, httpx.StreamError, SSEError) as exc:
        raise translate(exc) from exc
    finally:
        await response.aclose()
    return status_error(response.status_code, message)


def _timeout(total: float | None, connect: float) -> httpx.Timeout:
    # The read timeout bounds one wait between events; the whole-request deadline is
    # checked by the stream after each event.
    return httpx.Timeout(total, connect=connect if total is None else min(connect, total))


def _admin_headers(key: str | None) -> dict[str, str]:
    """HTTP headers for Triton's restricted APIs (the repository index)."""
    if not key:
        return {}
    from tritonforge.runtime.server import RESTRICTED_HEADER

    return {RESTRICTED_HEADER: key}


def _index(obj: Any) -> list[ModelInfo]:
    if not isinstance(obj, list):
        raise ProtocolError("repository index reply is not a JSON list")
    return [
        ModelInfo(str(m.get("name", "")), str(m.get("version", "")), str(m.get("state", "")),
                  str(m.get("reason", "")))
        for m in obj
    ]


# ----------------------------------------------------------------------------------------
class HttpCall:
    """One in-flight ``generate_stream`` request, iterated as decoded events."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._events: Iterator[ServerSentEvent] = EventSource(response).iter_sse()

    def __iter__(self) -> Iterator[_wire.Event]:
        return self

    def __next__(self) -> _wire.Event:
        while True:
            try:
                sse = next(self._events)
            except StopIteration:
                self._response.close()
                raise
            except (httpx.HTTPError, httpx.StreamError, SSEError) as exc:
                raise translate(exc) from exc
            if sse.data:
                return _wire.sse_event(sse.data)

    def cancel(self) -> None:
        """End the request, also from another thread: the socket is shut down first, so a
        read blocked on it returns at once (closing it alone does not wake that read, and a
        server that stopped sending when it saw the client go never sends the byte that would)."""
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._response.close()


class HttpTransport:
    """Sync HTTP transport on one ``httpx.Client``."""

    def __init__(self, base_url: str, *, admin_timeout: float, admin_key: str | None = None) -> None:
        self._admin_timeout = admin_timeout
        self._admin = _admin_headers(admin_key)
        self._client = httpx.Client(base_url=base_url, limits=_LIMITS, timeout=admin_timeout)

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise translate(exc) from exc

    def open(self, wire: Any, model: str, timeout: float | None) -> HttpCall:
        request = self._client.build_request(
            "POST", f"/v2/models/{model}/generate_stream", json=wire, headers=_SSE_HEADERS,
            timeout=_timeout(timeout, self._admin_timeout),
        )
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate(exc) from exc
        if response.status_code != 200:
            raise _read_error(response)
        return HttpCall(response)

    def index(self) -> list[ModelInfo]:
        reply = self._call("POST", "/v2/repository/index", json={}, headers=self._admin)
        if reply.status_code != 200:
            raise status_error(reply.status_code, error_text(reply.text))
        return _index(reply.json())

    def config(self, model: str) -> dict[str, Any]:
        """The model's configuration (JSON)."""
        reply = self._call("GET", f"/v2/models/{model}/config")
        if reply.status_code != 200:
            raise status_error(reply.status_code, error_text(reply.text))
        return dict(reply.json())

    def platform(self, model: str) -> str:
        return str(self.config(model).get("platform", ""))

    def engine_of(self, model: str) -> str | None:
        return _wire.engine_step(self.config(model))

    def stop(self, engine: str, request_id: str, timeout: float) -> None:
        # Its own connection: the shared pool may be busy with the very stream being closed
        # (from another thread), and the stop must not wait behind it.
        with httpx.Client(base_url=self._client.base_url, timeout=timeout) as one_off:
            one_off.post(f"/v2/models/{engine}/generate_stream",
                         json=_wire.http_stop_body(request_id), headers=_SSE_HEADERS)

    def model_ready(self, model: str) -> bool:
        return self._call("GET", f"/v2/models/{model}/ready").status_code == 200

    def server_ready(self) -> bool:
        return self._call("GET", "/v2/health/ready").status_code == 200

    def close(self) -> None:
        self._client.close()


# ----------------------------------------------------------------------------------------
class AsyncHttpCall:
    """One in-flight ``generate_stream`` request on an ``httpx.AsyncClient``."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._events: AsyncIterator[ServerSentEvent] = EventSource(response).aiter_sse()

    def __aiter__(self) -> AsyncIterator[_wire.Event]:
        return self

    async def __anext__(self) -> _wire.Event:
        while True:
            try:
                sse = await self._events.__anext__()
            except StopAsyncIteration:
                await self._response.aclose()
                raise
            except (httpx.HTTPError, httpx.StreamError, SSEError) as exc:
                raise translate(exc) from exc
            if sse.data:
                return _wire.sse_event(sse.data)

    async def cancel(self) -> None:
        await self._response.aclose()


class AsyncHttpTransport:
    """asyncio HTTP transport on one ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, *, admin_timeout: float, admin_key: str | None = None) -> None:
        self._admin_timeout = admin_timeout
        self._admin = _admin_headers(admin_key)
        self._client = httpx.AsyncClient(base_url=base_url, limits=_LIMITS, timeout=admin_timeout)

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise translate(exc) from exc

    async def open(self, wire: Any, model: str, timeout: float | None) -> AsyncHttpCall:
        request = self._client.build_request(
            "POST", f"/v2/models/{model}/generate_stream", json=wire, headers=_SSE_HEADERS,
            timeout=_timeout(timeout, self._admin_timeout),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate(exc) from exc
        if response.status_code != 200:
            raise await _aread_error(response)
        return AsyncHttpCall(response)

    async def index(self) -> list[ModelInfo]:
        reply = await self._call("POST", "/v2/repository/index", json={}, headers=self._admin)
        if reply.status_code != 200:
            raise status_error(reply.status_code, error_text(reply.text))
        return _index(reply.json())

    async def config(self, model: str) -> dict[str, Any]:
        reply = await self._call("GET", f"/v2/models/{model}/config")
        if reply.status_code != 200:
            raise status_error(reply.status_code, error_text(reply.text))
        return dict(reply.json())

    async def platform(self, model: str) -> str:
        return str((await self.config(model)).get("platform", ""))

    async def engine_of(self, model: str) -> str | None:
        return _wire.engine_step(await self.config(model))

    async def stop(self, engine: str, request_id: str, timeout: float) -> None:
        async with httpx.AsyncClient(base_url=self._client.base_url, timeout=timeout) as one_off:
            await one_off.post(f"/v2/models/{engine}/generate_stream",
                               json=_wire.http_stop_body(request_id), headers=_SSE_HEADERS)

    async def model_ready(self, model: str) -> bool:
        return (await self._call("GET", f"/v2/models/{model}/ready")).status_code == 200

    async def server_ready(self) -> bool:
        return (await self._call("GET", "/v2/health/ready")).status_code == 200

    async def close(self) -> None:
        await self._client.aclose()
