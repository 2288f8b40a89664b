"""The gRPC streams of a Locust process, run on grpc's asyncio outside gevent.

Locust runs on gevent; gRPC's gevent integration (``grpc.experimental.gevent``) hands every
streamed message from a gRPC thread to the gevent hub, which capped one Locust process at
~1,000-1,200 chunks/s. gRPC's asyncio API cannot run inside a gevent-patched process either
(its completion-queue poller thread becomes a greenlet that never runs). So each Locust
process that runs :class:`~tritonforge.loadtests.users.GrpcStreamUser` starts one child
process, this module, which runs the streams with the typed ``AsyncClient`` on a plain
asyncio loop and hands back one line per finished request. Per request the Locust process
does two small pipe messages; per token it does nothing.

TTFT and latency are measured here, by the same code the typed client uses
(``Completion.ttft`` / ``latency``: ``perf_counter`` at send, first token, last response),
so they do not include the hand-off to the greenlet.

Protocol (JSON, one object per line): the parent writes ``{"url", "model", "timeout"}``
first, then ``{"id": N, "request": {...Request fields...}}`` per request and
``{"cancel": N}`` to abandon one; the child answers ``{"id": N, "text", "ttft", "latency",
"error"}``. End of input ends the child (live streams are cancelled, so the server stops
their work).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

__all__ = ["describe_error", "main", "request_fields"]

#: The Request fields a Locust user sets (see ``TritonForgeUser.request_for``).
_FIELDS = ("prompt", "messages", "max_tokens", "min_tokens", "stream", "timeout")


def describe_error(exc: BaseException) -> str:
    """``Type: first line`` of an exception, as Locust's failure table shows it."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def request_fields(request: Any) -> dict[str, Any]:
    """What crosses the pipe of a ``Request`` (its messages as plain lists/dicts)."""
    out = {f: getattr(request, f) for f in _FIELDS}
    if out["messages"] is not None:
        out["messages"] = [dict(m) for m in out["messages"]]
    return out


async def _serve(reader: asyncio.StreamReader, write: Any) -> None:
    from tritonforge.clients import AsyncClient, Request, TritonForgeError

    config = json.loads(await reader.readline())
    tasks: dict[int, asyncio.Task[None]] = {}
    async with AsyncClient(config["url"], protocol="grpc", model=config["model"],
                           timeout=config["timeout"], connect_retries=0) as client:

        async def run(rid: int, fields: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            reply: dict[str, Any] = {"id": rid, "text": "", "ttft": None, "latency": 0.0, "error": ""}
            try:
                async with client.stream(Request(**fields)) as s:
                    async for _ in s:
                        pass
                    done = s.completion
                reply.update(text=done.text, ttft=done.ttft, latency=done.latency)
            except asyncio.CancelledError:
                reply.update(error="cancelled by the load test", latency=time.perf_counter() - t0)
            except TritonForgeError as exc:
                reply.update(error=describe_error(exc), latency=time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - reported as the request's failure, never lost
                reply.update(error=describe_error(exc), latency=time.perf_counter() - t0)
            finally:
                tasks.pop(rid, None)
            write(reply)

        while line := await reader.readline():
            msg = json.loads(line)
            if "cancel" in msg:
                task = tasks.get(msg["cancel"])
                if task is not None:
                    task.cancel()
                continue
            rid = int(msg["id"])
            tasks[rid] = asyncio.get_running_loop().create_task(run(rid, msg["request"]))
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def _amain() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout

    def write(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        out.flush()

    await _serve(reader, write)


def main() -> None:
    try:
        asyncio.run(_amain())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
