"""Clients that leave mid-stream stop the engine's work, whoever they are; then a clean stop.

One ``tritonforge serve`` of the default repository of its own (a real subprocess, as a user
starts it), then for each kind of client, 8 long streams (``min_tokens`` = ``max_tokens`` =
1500, so none ends early) are dropped mid-stream:

* plain gRPC ``ModelStreamInfer`` (the generated stub, nothing of tritonforge): 4 calls
  cancelled, 4 whose channel is closed;
* plain HTTP SSE on ``generate_stream``: 4 responses closed, 4 sockets reset;
* the OpenAI gateway's streaming clients disconnecting;
* tritonforge's typed clients (4 gRPC, 4 HTTP) leaving the stream;
* the BLS model ``tensorrt_llm_bls`` over plain HTTP SSE;
* the non-streaming ``<name>_sync`` model over plain gRPC ``ModelInfer``, calls cancelled;
* the same model over plain HTTP ``/generate`` (4 connections closed, 4 reset): Triton 2.51's
  HTTP frontend does not notice these; ``serve``'s HTTP front does (``runtime.front``).

The oracles are not tritonforge's: the server's CPU time, summed over every process under
``serve`` from /proc, must fall to its idle level within 3 s of the drop; vLLM's own
scheduler (through the engine's running gauge) must be back to 0; the engine's count of
cancelled finishes must rise by 8; a follow-up request's time to first token must be within
1.5x the idle one. Each check first proves that the streams would still be generating at
that point had they not been cancelled (remaining tokens / measured tokens per second).

Finally SIGTERM on ``serve`` with 8 streams live: each ends with a final response (finish_reason
"cancelled") or NOT_READY "server is shutting down", serve exits within 10 s, Triton's
log has no "in-flight inferences" countdown, every model unloads (tritonserver exits 0), and
no process of its tree survives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from conftest import ServeProcess, descendants, engine_gauge, serve_process, tree_cpu_rate
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonforge.clients import Cancelled, Client, ModelNotReady, ServerUnavailable
from tritonforge.contract import MODEL_BLS
from tritonforge.gateway import run_gateway_in_thread

pytestmark = pytest.mark.server

PROMPT = "Write a long story about a lighthouse keeper and the sea."
LONG = 1500  # min_tokens = max_tokens: no stream ends by itself during a test
N = 8  # streams dropped per client kind
CHECK = 3.0  # seconds after the drop within which the server must be idle again
IDLE_MARGIN = 0.15  # cores above the idle level that still count as idle
CANCELLED = 'tritonforge_engine_requests_finished_total{finish_reason="cancelled"'


@dataclass
class Served:
    """The module's ``serve`` and what the tests measured of it."""

    sp: ServeProcess
    idle_cpu: float = 0.0
    figures: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sp, name)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_process(tmp_path_factory.mktemp("drops") / "tritonserver.log") as sp:
        s = Served(sp)
        try:
            _wait_idle(s, 60)
            s.idle_cpu = min(tree_cpu_rate(sp.proc.pid, 1.0) for _ in range(2))
            yield s
        finally:
            print("\n" + "\n".join(s.figures))


def _cancelled(s: Served) -> float:
    with urllib.request.urlopen(f"http://{s.metrics_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(CANCELLED))


def _wait_idle(s: Served, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while engine_gauge(s.metrics_url) > 0 or engine_gauge(s.metrics_url, "tritonforge_engine_requests_waiting") > 0:
        assert time.monotonic() < deadline, (
            f"the engine did not become idle: running {engine_gauge(s.metrics_url)}, waiting "
            f"{engine_gauge(s.metrics_url, 'tritonforge_engine_requests_waiting')}, server CPU "
            f"{tree_cpu_rate(s.proc.pid, 0.5):.2f} cores, cancelled {_cancelled(s)}")
        time.sleep(0.2)


def _ttft(s: Served) -> float:
    """Shortest time to first token of 5 short requests, measured here (wall clock). The
    shortest, not the median: a request the engine still generates for nobody slows every
    one of the 5, while other work on this 2-core machine (another test's server) slows some."""
    values = []
    with Client(s.grpc_url, model=s.model, timeout=60) as client:
        for _ in range(5):
            t0 = time.perf_counter()
            first = None
            with client.stream(PROMPT, max_tokens=1, min_tokens=1) as stream:
                for chunk in stream:  # read to the end: nothing is cancelled here
                    if chunk.tokens and first is None:
                        first = time.perf_counter() - t0
            assert first is not None
            values.append(first)
    return min(values)


# -- one drop per client kind: each returns once the stream is under way -------------------
@dataclass
class Progress:
    """A stream's tokens seen so far, and when the first and the last arrived."""

    tokens: int = 0
    first: float = 0.0
    last: float = 0.0

    def saw(self, n: int = 1) -> None:
        now = time.monotonic()
        if not self.tokens:
            self.first = now
        self.tokens += n
        self.last = now


MIN_SEEN = 4  # tokens each stream shows before it is dropped


def _infer_request(model: str) -> Any:
    r = service_pb2.ModelInferRequest(model_name=model)
    t = r.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(PROMPT.encode())
    for name in ("max_tokens", "min_tokens"):
        t = r.inputs.add(name=name, datatype="INT32", shape=[1, 1])
        t.contents.int_contents.append(LONG)
    return r


def drop_grpc_stream(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    channel = grpc.insecure_channel(s.grpc_url)
    call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
        iter([_infer_request(s.model)]), timeout=600)
    with contextlib.suppress(grpc.RpcError):
        for _ in call:
            p.saw()
            if p.tokens >= MIN_SEEN:
                break
    go.wait()
    if i % 2:
        call.cancel()
    channel.close()  # without a cancel first: the connection just goes


def _sse_body() -> bytes:
    return json.dumps({"text_input": PROMPT, "max_tokens": LONG, "min_tokens": LONG}).encode()


def _drop_sse(s: Served, model: str, i: int, p: Progress, go: threading.Event) -> None:
    host, port = s.http_url.rsplit(":", 1)
    body = _sse_body()
    head = (f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {s.http_url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(head + body)
    buf = b""
    while p.tokens < MIN_SEEN:
        part = sock.recv(65536)
        assert part, "the server closed the stream"
        buf += part
        events = buf.count(b"data: ")  # one SSE event per engine response
        if events > p.tokens:
            p.saw(events - p.tokens)
    go.wait()
    if i % 2:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    sock.close()


def drop_http_sse(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    _drop_sse(s, s.model, i, p, go)


def drop_bls_sse(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    _drop_sse(s, MODEL_BLS, i, p, go)


def drop_typed(s: Served, i: int, p: Progress, go: threading.Event, min_seen: int = MIN_SEEN) -> None:
    url, protocol = (s.grpc_url, "grpc") if i % 2 else (s.http_url, "http")
    with Client(url, protocol=protocol, model=s.model, timeout=600) as client, \
            client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as stream:
        for chunk in stream:
            p.saw(chunk.tokens)
            if p.tokens >= min_seen:
                break
        go.wait()  # leaving the block with the stream open is the drop


def drop_sync_grpc(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    """Non-streamed: no tokens to see; the engine's running gauge says it is generating."""
    channel = grpc.insecure_channel(s.grpc_url)
    future = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(
        _infer_request(f"{s.model}_sync"), timeout=600)
    go.wait()
    future.cancel()
    channel.close()


def drop_sync_http(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    """Non-streamed over HTTP: the connection waits for the one answer; closed or reset."""
    host, port = s.http_url.rsplit(":", 1)
    body = _sse_body()
    head = (f"POST /v2/models/{s.model}_sync/generate HTTP/1.1\r\nHost: {s.http_url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection((host, int(port)), timeout=120)
    sock.sendall(head + body)
    go.wait()
    if i % 2:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    sock.close()


_GATEWAY: dict[str, Any] = {}
_RATE: dict[int, float] = {}  # tokens/s per stream, with n streams at once


def drop_gateway(s: Served, i: int, p: Progress, go: threading.Event) -> None:
    body = {"model": s.model, "prompt": PROMPT, "max_tokens": LONG, "min_tokens": LONG,
            "stream": True}
    with httpx.Client(timeout=600) as http, \
            http.stream("POST", f"{_GATEWAY['url']}/completions", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data:") and '"text"' in line:
                p.saw()
                if p.tokens >= MIN_SEEN:
                    break
        go.wait()  # closing the response closes the connection


KINDS: dict[str, Callable[[Served, int, Progress, threading.Event], None]] = {
    "grpc-stream": drop_grpc_stream,
    "http-sse": drop_http_sse,
    "openai-gateway": drop_gateway,
    "typed-clients": drop_typed,
    "bls-http-sse": drop_bls_sse,
    "sync-grpc": drop_sync_grpc,
    "sync-http": drop_sync_http,
}


def _measure_rate(s: Served, n: int) -> float:
    """Tokens/s per stream with ``n`` typed streams at once: each reads 3x MIN_SEEN tokens,
    then leaves."""
    progress = [Progress() for _ in range(n)]
    go = threading.Event()
    go.set()
    threads = [threading.Thread(target=drop_typed, args=(s, i, progress[i], go, 3 * MIN_SEEN))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _wait_idle(s, 30)
    return statistics.median((p.tokens - 1) / (p.last - p.first) for p in progress if p.last > p.first)


@pytest.fixture(scope="module")
def gateway(served: Served) -> Iterator[str]:
    with run_gateway_in_thread(served.grpc_url, served.model) as gw:
        _GATEWAY["url"] = gw.url
        yield gw.url


@pytest.mark.parametrize("kind", list(KINDS))
def test_dropped_streams_stop_the_engine(served: Served, gateway: str, kind: str) -> None:
    s = served
    _wait_idle(s, 120)
    if 1 not in _RATE:  # the fastest a stream can go: one alone on the server
        _RATE[1] = _measure_rate(s, 1)
    idle_ttft = _ttft(s)  # the baseline, in the same conditions as the follow-up
    cancelled_before = _cancelled(s)
    progress = [Progress() for _ in range(N)]
    go = threading.Event()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            KINDS[kind](s, i, progress[i], go)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            go.wait()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(N)]
    started = time.monotonic()
    for t in threads:
        t.start()
    deadline = started + 180
    # Under way: every stream showed tokens (the non-streamed kind: vLLM's scheduler runs them).
    while True:
        streaming = all(p.tokens >= MIN_SEEN for p in progress)
        if kind.startswith("sync-"):  # Triton queues what its instances cannot take yet
            streaming = engine_gauge(s.metrics_url) >= 1 and time.monotonic() - started > 2
        if streaming or errors:
            break
        assert time.monotonic() < deadline, f"{kind}: streams not under way: {[p.tokens for p in progress]}"
        time.sleep(0.05)
    assert not errors, errors
    busy = tree_cpu_rate(s.proc.pid, 1.0)
    in_engine = int(engine_gauge(s.metrics_url)) if kind.startswith("sync-") else N
    go.set()
    t_drop = time.monotonic()
    # Would the streams still be generating at the check, uncancelled? Not one of them can
    # have gone faster than a stream alone on the server since it was sent.
    seen = _RATE[1] * (t_drop - started)
    remaining_s = (LONG - seen) / _RATE[1]
    assert remaining_s > 4 * CHECK, f"{kind}: streams could end by themselves ({remaining_s:.1f} s left)"
    idle_at = None
    while time.monotonic() - t_drop < CHECK:
        cpu = tree_cpu_rate(s.proc.pid, 0.5)
        if cpu <= s.idle_cpu + IDLE_MARGIN:
            idle_at = time.monotonic() - t_drop
            break
    for t in threads:
        t.join(30)
    assert idle_at is not None, (f"{kind}: the server still used {cpu:.2f} cores {CHECK:.0f} s after "
                                 f"{N} drops (idle {s.idle_cpu:.2f}, busy {busy:.2f})")
    deadline = time.monotonic() + 10
    while _cancelled(s) - cancelled_before < N and time.monotonic() < deadline:
        time.sleep(0.1)
    rose = _cancelled(s) - cancelled_before
    assert rose == N, f"{kind}: cancelled finishes rose by {rose}, not {N}"
    _wait_idle(s, 10)  # vLLM's own scheduler: nothing running or waiting
    ttft = _ttft(s)
    s.figures.append(f"drops {kind:15s}: {N} dropped ({in_engine} in the engine) after {t_drop - started:.1f} s "
                     f"(at most {seen:.0f} tokens at {_RATE[1]:.0f} tok/s: >= {remaining_s:.0f} s of "
                     f"generation left); server CPU {busy:.2f} -> idle "
                     f"({s.idle_cpu:.2f}) within {idle_at:.2f} s; TTFT after {ttft * 1000:.0f} ms "
                     f"(idle {idle_ttft * 1000:.0f} ms); load average {os.getloadavg()[0]:.2f}")
    assert ttft <= 1.5 * idle_ttft + 0.02, (kind, ttft, idle_ttft)



def test_sigterm_under_load_ends_every_stream_and_exits_cleanly(served: Served) -> None:
    s = served
    _wait_idle(s, 120)
    outcome: list[str] = []
    seen = threading.Barrier(N + 1)

    def one(i: int) -> None:
        url, protocol = (s.grpc_url, "grpc") if i % 2 else (s.http_url, "http")
        try:
            with Client(url, protocol=protocol, model=s.model, timeout=120) as client, \
                    client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as stream:
                for n, _ in enumerate(stream):
                    if n == 1:
                        seen.wait(60)
            outcome.append("finished")
        except (Cancelled, ModelNotReady, ServerUnavailable) as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome.append(f"unexpected {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(N)]
    for t in threads:
        t.start()
    seen.wait(120)
    tree = [s.proc.pid, *descendants(s.proc.pid)]
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(30)
    took = time.monotonic() - t0
    for t in threads:
        t.join(30)
    out = s.output()
    survivors = [pid for pid in tree if Path(f"/proc/{pid}").exists()
                 and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    log = s.log.read_text(errors="replace")
    s.figures.append(f"SIGTERM with {N} live streams (load average {os.getloadavg()[0]:.2f}): serve exited in "
                     f"{took:.1f} s ({out.strip().splitlines()[-1]!r}); "
                     f"streams: {sorted({o.split(':')[0] for o in outcome})}")
    assert took <= 10.0, took
    # The drain left no request for Triton to wait on: no "Model 'x' has N in-flight" countdown.
    assert not re.search(r"has [1-9][0-9]* in-flight inferences", log), log[-3000:]
    # Every model unloaded inside Triton's exit timeout: tritonserver (and serve) exit 0.
    assert "tritonserver exit code 0" in out, (out[-2000:], [ln for ln in log.splitlines() if "live models" in ln][-1:])
    assert not survivors, f"processes left after serve exited: {survivors}"
    # A stream that had started ends with a final response saying it was cancelled (an
    # error there would keep Triton 2.51 from unloading the ensemble), which the typed
    # client raises as Cancelled; one that had not streamed yet gets NOT_READY.
    clear = ("Cancelled: request cancelled on the server", "ModelNotReady: server is shutting down")
    assert len(outcome) == N and all(o.startswith(clear) for o in outcome), outcome
