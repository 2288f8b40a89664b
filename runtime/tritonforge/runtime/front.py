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
from typing import Any, Final, NamedTuple

import aiohttp
from tritonforge.contract import FRONT_KEY_PARAMETER
from yarl import URL

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
        self._client: aiohttp.ClientSession | None = None

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
                # aiohttp, not httpx: its C response parser costs a fraction of httpx's pure-Python
                # one per relayed SSE chunk (measured: benchmarks/bench_peer.py triton vs
                # triton-direct). One connection per request, closed after it: Triton 2.51's
                # shutdown waits for every open HTTP connection (an idle pooled one made it exit 1).
                self._client = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True, limit=0),
                    timeout=aiohttp.ClientTimeout(total=None, connect=5.0),
                    auto_decompress=False,  # relay the bytes as Triton sent them
                    # No User-Agent, Accept-Encoding etc. the client did not send.
                    skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.close()
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
        request = _Request(scope["method"], URL(f"http://{self.upstream}{url.decode('latin-1')}", encoded=True),
                           [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers], body)
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
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await relay
                return
            mark = self.cancel_dir / key
            mark.touch()
            try:  # Triton answers soon (the model stops the engine); then forget the key
                with contextlib.suppress(aiohttp.ClientError):
                    await relay
            finally:
                mark.unlink(missing_ok=True)
        finally:
            gone.cancel()
            if not relay.done():
                relay.cancel()

    async def _relay(self, request: _Request, send: Send) -> None:
        assert self._client is not None
        try:
            response = await self._client.request(request.method, request.url, headers=request.headers,
                                                  data=request.body or None, allow_redirects=False)
        except aiohttp.ClientError as exc:
            await _answer(send, 503, {"error": f"the server is not reachable: {exc}"})
            return
        try:
            await send({
                "type": "http.response.start", "status": response.status,
                "headers": [(k, v) for k, v in response.raw_headers if k.lower() not in _HOP or k.lower() == b"content-length"],
            })
            try:
                async for chunk in response.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except aiohttp.ClientError as exc:  # tritonserver went away mid-response: so does the client's
                print(f"front: {request.method} {request.url.path}: the server broke off the response ({exc!r}); "
                      "closing the client's connection", file=sys.stderr, flush=True)
                return  # uvicorn closes a connection whose response was not completed
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.close()  # the connection goes with it (on a cancel too: Triton sees the client leave)


class _Request(NamedTuple):
    method: str
    url: URL
    headers: list[tuple[str, str]]
    body: bytes


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
