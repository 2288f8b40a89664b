"""The server killed under load: clients fail fast and typed, then recover after a restart.

A SEPARATE real server (``start_server`` from conftest; the shared one is left alone)
serves 8 streams (gRPC and HTTP, sync and asyncio typed clients) when its whole process
group is SIGKILLed. Every stream must raise ``ServerUnavailable`` well within its timeout;
new requests while it is down raise ``ServerUnavailable`` too; nothing hangs. The server is
started again on the same ports, and new requests -- from new clients and from the clients
that saw the failure -- succeed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DEFAULT_REPO, _default_model_name, start_server
from tritonforge.clients import AsyncClient, Client, ServerUnavailable

pytestmark = pytest.mark.server

PROMPT = "Once upon a time, there was a little"  # a completion prompt: never an immediate EOS
LONG = 400
TIMEOUT = 60.0  # the clients' request deadline: ServerUnavailable must come well before it
STREAMS_PER_KIND = 2


@pytest.fixture(scope="module")
def own_server() -> Iterator[tuple[Any, Any]]:
    # vLLM's CPU worker pins itself to core 0 by default; a second engine on the same machine
    # (this one, beside the shared server) would share that one core. Let it float.
    previous = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        server, handle = start_server(DEFAULT_REPO, log_name="reliability-server-loss")
    finally:
        if previous is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = previous
    server.options.env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # for the restart too
    handle.model = _default_model_name()
    try:
        yield server, handle
    finally:
        server.stop()  # type: ignore[attr-defined]


def _sync_stream(client: Client, started: threading.Event, out: list[Any]) -> None:
    t0 = time.monotonic()
    try:
        with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as s:
            for chunk in s:
                if chunk.index == 0:
                    started.set()
        out.append(("finished", time.monotonic() - t0))
    except BaseException as exc:  # noqa: BLE001 - recorded and asserted on
        out.append((exc, time.monotonic()))


def test_clients_raise_server_unavailable_and_recover_after_restart(own_server: tuple[Any, Any]) -> None:
    server, h = own_server
    model = h.model
    # Warm up both transports, so streams start at once.
    for protocol, url in (("grpc", h.grpc_url), ("http", h.http_url)):
        with Client(url, protocol=protocol, model=model) as c:  # type: ignore[arg-type]
            assert c.complete(PROMPT, max_tokens=4).completion_tokens > 0

    # Default connect retries: they apply only before a stream's first response, and they let a
    # client whose channel is still backing off reconnect once the server is back.
    sync_clients = {p: Client(u, protocol=p, model=model, timeout=TIMEOUT)  # type: ignore[arg-type]
                    for p, u in (("grpc", h.grpc_url), ("http", h.http_url))}
    results: list[Any] = []
    events: list[threading.Event] = []
    threads = []
    for client in sync_clients.values():
        for _ in range(STREAMS_PER_KIND):
            ev = threading.Event()
            events.append(ev)
            threads.append(threading.Thread(target=_sync_stream, args=(client, ev, results), daemon=True))

    async_results: list[Any] = []
    async_started = threading.Event()
    killed_at: list[float] = []

    async def async_side() -> None:
        clients = [AsyncClient(u, protocol=p, model=model, timeout=TIMEOUT, connect_retries=0)  # type: ignore[arg-type]
                   for p, u in (("grpc", h.grpc_url), ("http", h.http_url))]

        async def one(client: AsyncClient) -> None:
            try:
                async with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as s:
                    async for chunk in s:
                        if chunk.index == 0:
                            async_started.set()
                async_results.append("finished")
            except Exception as exc:  # noqa: BLE001 - asserted on
                async_results.append((exc, time.monotonic()))

        try:
            await asyncio.wait_for(asyncio.gather(*[one(c) for c in clients for _ in range(STREAMS_PER_KIND)]),
                                   TIMEOUT + 30)
        finally:
            for c in clients:
                await c.aclose()

    async_thread = threading.Thread(target=lambda: asyncio.run(async_side()), daemon=True)
    for t in threads:
        t.start()
    async_thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (all(e.is_set() for e in events) and async_started.is_set()):
        time.sleep(0.1)
    assert all(e.is_set() for e in events) and async_started.is_set(), "streams did not start"

    # Kill the whole server (tritonserver, backend stubs, engine workers) with no warning.
    pid = server.process.pid
    os.killpg(pid, signal.SIGKILL)
    killed_at.append(time.monotonic())
    server.process.wait(30)
    for t in threads:
        t.join(TIMEOUT + 30)
    async_thread.join(TIMEOUT + 60)
    assert not any(t.is_alive() for t in threads) and not async_thread.is_alive(), "a client hung"
    failures = [r for r in results + async_results if r != "finished" and not (isinstance(r, tuple) and r[0] == "finished")]
    assert len(failures) == 4 * STREAMS_PER_KIND, (results, async_results)
    slowest = 0.0
    for exc, at in failures:
        assert isinstance(exc, ServerUnavailable), repr(exc)
        slowest = max(slowest, at - killed_at[0])
    assert slowest < TIMEOUT, slowest

    # While it is down: refused at once, typed.
    down_errors = 0
    for protocol, client in sync_clients.items():
        t0 = time.monotonic()
        with pytest.raises(ServerUnavailable):
            client.complete(PROMPT, max_tokens=4)
        assert time.monotonic() - t0 < TIMEOUT
        down_errors += 1

    # Same ports again.
    server.stop()
    server.start()
    restart = server.wait_ready(timeout=900)
    for protocol, url in (("grpc", h.grpc_url), ("http", h.http_url)):
        with Client(url, protocol=protocol, model=model) as fresh:  # type: ignore[arg-type]
            assert fresh.complete(PROMPT, max_tokens=6, temperature=0.0).completion_tokens > 0
    for client in sync_clients.values():  # the clients that saw the failure reconnect
        assert client.complete(PROMPT, max_tokens=6, temperature=0.0).completion_tokens > 0
        client.close()
    print(f"\nserver loss: {len(failures)} streams in flight raised ServerUnavailable within {slowest:.2f} s "
          f"of SIGKILL (timeout {TIMEOUT:.0f} s); {down_errors} requests refused while down; restarted "
          f"on the same ports in {restart:.0f} s; new and old clients served")
