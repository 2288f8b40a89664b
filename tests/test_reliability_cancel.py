"""Interrupted requests leave nothing behind in the engine.

100 gRPC streams (typed ``AsyncClient``, 16 at a time) are cancelled at random points --
before the first token (task cancellation), or after a random number of chunks (leaving the
stream) -- and HTTP clients drop their connection mid-stream (closing the response, or
resetting the TCP socket). Afterwards the engine's own gauges on the metrics endpoint
(``tritonforge_engine_requests_running`` / ``_waiting``) go back to 0 and its KV cache usage
back to the idle baseline within a few seconds.

Triton 2.51 ensembles do not pass a client's cancellation on to a step that is already
running, so the typed clients send the engine's ``stop`` for a stream they leave, and a bare
HTTP client that just drops its connection is served by the BLS front model
(``tensorrt_llm_bls``), which sees its own request cancelled and stops the engine.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
import urllib.request
from typing import Any

import httpx
import pytest
from conftest import default_engine_args
from tritonforge.clients import AsyncClient, Cancelled
from tritonforge.contract import MODEL_BLS
from tritonforge.triton_models.metrics import KV_CACHE_USAGE, REQUESTS_RUNNING, REQUESTS_WAITING

pytestmark = pytest.mark.server

PROMPT = "Write a long story about a lighthouse keeper and the sea."
LONG = 400  # tokens: far more than any stream here lives for, so only cancellation ends it
STREAMS = 100
CONCURRENCY = 16
SETTLE = 10.0  # seconds the engine gets to drop every cancelled request
IDLE_WAIT = 180.0  # seconds to wait for other tests' requests before measuring the baseline


def gauges(metrics_url: str) -> dict[str, float]:
    """Sums over label sets of the engine's running/waiting/KV gauges."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out = {REQUESTS_RUNNING: 0.0, REQUESTS_WAITING: 0.0, KV_CACHE_USAGE: 0.0}
    seen = set()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
            seen.add(name)
    assert seen == set(out), f"engine gauges missing on {metrics_url}: {set(out) - seen}"
    return out


def wait_idle(metrics_url: str, seconds: float, kv_baseline: float | None = None) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:
        g = gauges(metrics_url)
        idle = g[REQUESTS_RUNNING] == 0 and g[REQUESTS_WAITING] == 0
        if kv_baseline is not None:
            idle = idle and g[KV_CACHE_USAGE] <= kv_baseline + 1e-9
        if idle or time.monotonic() > deadline:
            return g
        time.sleep(0.1)


async def _one_stream(client: AsyncClient, rng: random.Random, stats: dict[str, int]) -> None:
    mode = rng.choice(("task", "chunks", "chunks"))
    if mode == "task":
        # Cancel the task wherever it is: connecting, queued, or mid-generation.
        task = asyncio.ensure_future(client.complete(PROMPT, max_tokens=LONG, min_tokens=LONG))
        await asyncio.sleep(rng.uniform(0.0, 1.5))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            stats["cancelled"] += 1
            return
        stats["finished"] += 1
        return
    stop_after = rng.randint(0, 12)
    async with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as s:
        async for chunk in s:
            if chunk.index >= stop_after:
                break
        else:
            stats["finished"] += 1
            return
    stats["cancelled"] += 1  # leaving the block with the stream open cancels the request


def test_hundred_grpc_streams_cancelled_at_random_points_leave_no_requests(triton_server: Any) -> None:
    metrics = triton_server.metrics_url
    before = wait_idle(metrics, IDLE_WAIT)
    assert before[REQUESTS_RUNNING] == 0 and before[REQUESTS_WAITING] == 0, f"not idle: {before}"
    kv_baseline = before[KV_CACHE_USAGE]
    stats = {"cancelled": 0, "finished": 0}
    peak = {"running": 0.0}
    rng = random.Random(20261130)

    async def main() -> None:
        sem = asyncio.Semaphore(CONCURRENCY)
        async with AsyncClient(triton_server.grpc_url, model=triton_server.model, timeout=300) as client:

            async def bounded() -> None:
                async with sem:
                    await _one_stream(client, rng, stats)

            async def watch() -> None:
                while True:
                    g = await asyncio.to_thread(gauges, metrics)
                    peak["running"] = max(peak["running"], g[REQUESTS_RUNNING] + g[REQUESTS_WAITING])
                    await asyncio.sleep(0.5)

            watcher = asyncio.create_task(watch())
            await asyncio.gather(*[bounded() for _ in range(STREAMS)])
            watcher.cancel()

    started = time.monotonic()
    asyncio.run(main())
    took = time.monotonic() - started
    after = wait_idle(metrics, SETTLE, kv_baseline)
    print(f"\ngRPC: {STREAMS} streams, {stats['cancelled']} cancelled at random points, "
          f"{stats['finished']} finished, {CONCURRENCY} at a time, {took:.1f} s; peak in engine "
          f"{peak['running']:.0f}; after {SETTLE:.0f} s: {after}")
    assert stats["cancelled"] == STREAMS
    assert peak["running"] >= 2, "the streams never overlapped in the engine"
    assert after[REQUESTS_RUNNING] == 0, after
    assert after[REQUESTS_WAITING] == 0, after
    assert after[KV_CACHE_USAGE] <= kv_baseline + 1e-9, (kv_baseline, after)


def _http_drop_by_close(url: str, model: str, events: int) -> bool:
    """Read ``events`` SSE events, then close the response (the connection goes with it)."""
    body = {"text_input": PROMPT, "max_tokens": LONG, "min_tokens": LONG}
    with httpx.Client(timeout=120) as client, client.stream(
        "POST", f"http://{url}/v2/models/{model}/generate_stream", json=body
    ) as reply:
        assert reply.status_code == 200
        seen = 0
        for line in reply.iter_lines():
            if line.startswith("data:"):
                seen += 1
                if seen >= events:
                    return True
    return False


def _http_drop_by_reset(url: str, model: str, wait_bytes: int) -> bool:
    """Raw socket: send the request, read a little, then reset the connection (RST)."""
    host, port = url.rsplit(":", 1)
    import json

    body = json.dumps({"text_input": PROMPT, "max_tokens": LONG, "min_tokens": LONG}).encode()
    head = (f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    try:
        sock.sendall(head + body)
        got = b""
        while len(got) < wait_bytes:
            part = sock.recv(4096)
            if not part:
                return False
            got += part
        return b"200 OK" in got
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def test_http_clients_dropping_the_connection_mid_stream_leave_no_requests(triton_server: Any) -> None:
    metrics, url = triton_server.metrics_url, triton_server.http_url
    before = wait_idle(metrics, IDLE_WAIT)
    assert before[REQUESTS_RUNNING] == 0 and before[REQUESTS_WAITING] == 0, f"not idle: {before}"
    kv_baseline = before[KV_CACHE_USAGE]
    rng = random.Random(7)
    dropped: list[bool] = []
    lock = threading.Lock()

    def raw_drop(i: int) -> None:  # a bare HTTP client against the cancellable front model
        if i % 2:
            ok = _http_drop_by_close(url, MODEL_BLS, rng.randint(1, 8))
        else:
            ok = _http_drop_by_reset(url, MODEL_BLS, rng.randint(200, 1500))
        with lock:
            dropped.append(ok)

    threads = [threading.Thread(target=raw_drop, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)

    left = {"n": 0}

    async def typed() -> None:  # the typed HTTP client leaving streams of the ensemble early
        async with AsyncClient(url, protocol="http", model=triton_server.model, timeout=300) as client:

            async def one(stop_after: int) -> None:
                async with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as s:
                    async for chunk in s:
                        if chunk.index >= stop_after:
                            left["n"] += 1
                            break

            await asyncio.gather(*[one(rng.randint(0, 8)) for _ in range(12)])

    asyncio.run(typed())
    after = wait_idle(metrics, SETTLE, kv_baseline)
    print(f"\nHTTP: {len(dropped)} bare connections dropped mid-stream ({sum(dropped)} after data arrived) "
          f"and {left['n']} typed-client streams left early; after {SETTLE:.0f} s: {after}")
    assert len(dropped) == 12 and all(dropped)
    assert left["n"] == 12
    assert after[REQUESTS_RUNNING] == 0, after
    assert after[REQUESTS_WAITING] == 0, after
    assert after[KV_CACHE_USAGE] <= kv_baseline + 1e-9, (kv_baseline, after)


def test_closing_a_stream_from_another_thread_and_queued_cancels(triton_server: Any) -> None:
    """More streams than the engine's batch (the default repository's max_num_seqs, + 8): the
    queued ones are cancelled while still waiting (vLLM's scheduler reported them waiting),
    which must drain the waiting gauge too."""
    metrics = triton_server.metrics_url
    before = wait_idle(metrics, IDLE_WAIT)
    kv_baseline = before[KV_CACHE_USAGE]
    seen_waiting = {"max": 0.0}
    streams = int(default_engine_args()["max_num_seqs"]) + 8  # type: ignore[call-overload]

    async def main() -> None:
        async with AsyncClient(triton_server.grpc_url, model=triton_server.model, timeout=300) as client:
            tasks = [asyncio.ensure_future(client.complete(PROMPT, max_tokens=LONG, min_tokens=LONG))
                     for _ in range(streams)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                g = await asyncio.to_thread(gauges, metrics)
                seen_waiting["max"] = max(seen_waiting["max"], g[REQUESTS_WAITING])
                if g[REQUESTS_RUNNING] + g[REQUESTS_WAITING] >= streams:
                    break
                await asyncio.sleep(0.2)
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, (asyncio.CancelledError, Cancelled)) for r in results), results

    asyncio.run(main())
    after = wait_idle(metrics, SETTLE, kv_baseline)
    print(f"\n{streams} concurrent streams cancelled together (waiting peak {seen_waiting['max']:.0f}); after: {after}")
    assert seen_waiting["max"] > 0, "no stream was ever queued: the test did not test cancelling queued ones"
    assert after[REQUESTS_RUNNING] == 0 and after[REQUESTS_WAITING] == 0, after
    assert after[KV_CACHE_USAGE] <= kv_baseline + 1e-9, (kv_baseline, after)
