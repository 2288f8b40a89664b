"""The HTTP front of ``tritonforge serve``: Triton's HTTP API on the public port, plus the one
signal Triton 2.51's HTTP frontend does not give -- a client that left a non-streamed call.

Triton's HTTP frontend cancels a ``generate_stream`` request when the client disconnects (it
notices when the next chunk cannot be written), but a client that leaves a non-streamed
``/generate`` or ``/infer`` call is never noticed: the connection is not read while the
request runs, and the engine generates that whole answer for nobody (measured, see
docs/reliability.md). ``serve`` therefore starts ``tritonserver`` with its HTTP port on a
private loopback port and puts this front on the public one:

* Every request is relayed as it is (method, path, query, headers, body; the response's
  status, headers and body bytes, streamed as they come, so SSE chunks are not held back).
* A client that disconnects closes the upstream connection too, so Triton sees a streaming
  client leave exactly as it would without the front.
* A non-streamed ``POST .../generate`` or ``.../infer`` gets a key of the front's own
  (``contract.FRONT_KEY_PARAMETER``: a JSON key added to a ``generate`` body, a header of an
  ``infer`` call that Triton forwards as a request parameter). If the client disconnects
  before the answer, the front creates a file named by the key in the cancel folder
  (``contract.CANCEL_DIR_ENV``); tritonforge's ``_sync`` model, which polls its live
  requests, stops the engine for that request as it does for a cancelled gRPC call. The file
  is removed once Triton has answered the request.

Run by ``runtime.server.TritonServer`` (``ServerOptions.front``) as its own process::

    python -m tritonforge.runtime.front --port 8000 --upstream 127.0.0.1:PORT --cancel-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, Final

import httpx
from tritonforge.contract import FRONT_KEY_PARAMETER

__all__ = ["Front", "main", "with_front_key"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Non-streamed inference calls: the ones whose client Triton's HTTP frontend cannot see leave.
_WATCHED: Final = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/(generate|infer)$")
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the relay sets itself.
_HOP: Final = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
    b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
})
_KEY_HEADER: Final = FRONT_KEY_PARAMETER.encode()


class ReservedKey(ValueError):
    """The client sent the front's own key."""


def with_front_key(body: bytes, key: str) -> bytes | None:
    """A ``generate`` body with the front's key added as one more top-level JSON key, every
    other byte as the client sent it; None when the body is not a JSON object (Triton then
    answers it as it would without the front). :class:`ReservedKey` if the client sent it."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    if FRONT_KEY_PARAMETER in parsed:
        raise ReservedKey(f"{FRONT_KEY_PARAMETER} is set by the server; remove it from the request")
    start = body.find(b"{")
    rest = body[start + 1:]
    entry = json.dumps({FRONT_KEY_PARAMETER: key})[1:-1].encode()
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return body[:start + 1] + entry + sep + rest


class Front:
    """The ASGI application: a relay to Triton's HTTP port with the cancel signal above."""

    def __init__(self, upstream: str, cancel_dir: Path) -> None:
        self.upstream = upstream
        self.cancel_dir = cancel_dir
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.cancel_dir.mkdir(parents=True, exist_ok=True)
                self._client = httpx.AsyncClient(
                    base_url=f"http://{self.upstream}", timeout=httpx.Timeout(None, connect=5.0),
                    # One connection per request, closed after it: Triton 2.51's shutdown waits
                    # for every open HTTP connection (an idle pooled one made it exit 1).
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                )
                self._client.headers.clear()  # no Accept-Encoding etc. the client did not send
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self._client is not None
        chunks = []
        while True:  # the request body (small: prompts and parameters, or an infer tensor set)
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP and k.lower() != _KEY_HEADER]
        headers.append((b"connection", b"close"))
        key = None
        if scope["method"] == "POST" and (m := _WATCHED.match(scope["path"])):
            key = uuid.uuid4().hex
            if m.group(1) == "generate":
                try:
                    tagged = with_front_key(body, key)
                except ReservedKey as exc:
                    await _answer(send, 400, {"error": str(exc)})
                    return
                if tagged is None:
                    key = None
                else:
                    body = tagged
            else:
                headers.append((_KEY_HEADER, key.encode()))
        url = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            url += b"?" + scope["query_string"]
        request = self._client.build_request(scope["method"], url.decode("latin-1"), headers=headers, content=body)
        relay = asyncio.ensure_future(self._relay(request, send))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
            if relay.done():
                relay.result()
                return
            # The client left first.
            if key is None:
                relay.cancel()  # closes the upstream connection: Triton sees the client leave
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await relay
                return
            mark = self.cancel_dir / key
            mark.touch()
            try:  # Triton answers soon (the model stops the engine); then forget the key
                with contextlib.suppress(httpx.HTTPError):
                    await relay
            finally:
                mark.unlink(missing_ok=True)
        finally:
            gone.cancel()
            if not relay.done():
                relay.cancel()

    async def _relay(self, request: httpx.Request, send: Send) -> None:
        assert self._client is not None
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _answer(send, 503, {"error": f"the server is not reachable: {exc}"})
            return
        try:
            await send({
                "type": "http.response.start", "status": response.status_code,
                "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP or k.lower() == b"content-length"],
            })
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:  # tritonserver went away mid-response: so does the client's
                print(f"front: {scope_path(request)}: the server broke off the response ({exc!r}); "
                      "closing the client's connection", file=sys.stderr, flush=True)
                return  # uvicorn closes a connection whose response was not completed
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


def scope_path(request: httpx.Request) -> str:
    return f"{request.method} {request.url.path}"


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Send, status: int, payload: dict[str, str]) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _exit_with_parent() -> None:
    """The front lives in a session of its own (a Ctrl-C in the terminal must not cut the
    streams it relays while the server drains): leave when the process that started it dies."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="host:port of Triton's HTTP frontend")
    parser.add_argument("--cancel-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    threading.Thread(target=_exit_with_parent, name="front-parent", daemon=True).start()
    config = uvicorn.Config(
        Front(args.upstream, args.cancel_dir), host=args.host, port=args.port, log_level="warning",
        access_log=False, lifespan="on", server_header=False, date_header=False,
        timeout_graceful_shutdown=5, timeout_keep_alive=75,
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
