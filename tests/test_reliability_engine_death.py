"""vLLM's EngineCore process dies under load: what clients and the health endpoint see.

``tritonforge serve`` of its own (a real subprocess). The oracle is the operating system:
the test SIGKILLs the real ``VLLM::EngineCore`` process, found by walking the server's
process tree in /proc, while requests are running. Then:

* the streams that were running fail as an engine failure (typed ``EngineError``, not
  ``InvalidRequest``), the OpenAI gateway answers 5xx in OpenAI's error shape;
* within 10 s ``/v2/health/ready`` fails and a new typed request fails fast with
  ``ModelNotReady`` or ``ServerUnavailable`` (Triton 2.51 cannot mark a Python model not
  ready: the engine model reports ``tritonforge_engine_up 0`` and ``serve`` restarts the
  server);
* the server comes back and serves again.

The module's other failures on the same ``serve``: tritonserver itself crashing, and a Python
backend stub stalled past Triton's health deadline (``serve`` starts the server again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ServeProcess, descendants, serve_process, wait_engine_gauge
from tritonforge.clients import (
    Client,
    EngineError,
    InvalidRequest,
    ModelNotReady,
    ServerError,
    ServerUnavailable,
    TritonForgeError,
)
from tritonforge.gateway import run_gateway_in_thread

pytestmark = pytest.mark.server

LONG = 1500  # min_tokens = max_tokens: still generating when the engine is killed
PROMPT = "Once upon a time, there was a little"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serve_process(tmp_path_factory.mktemp("engine-death") / "tritonserver.log") as s:
        yield s


def _named(serve_pid: int, prefix: str) -> list[int]:
    """Processes under ``serve_pid`` whose name (/proc's comm, 15 characters) starts so."""
    pids = []
    for pid in descendants(serve_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith(prefix):
                pids.append(pid)
        except OSError:
            continue
    return pids


def engine_core_pids(server_pid: int) -> list[int]:
    return _named(server_pid, "VLLM::EngineCor")


def test_engine_death_fails_requests_turns_not_ready_and_recovers(served: ServeProcess) -> None:
    s = served
    cores = engine_core_pids(s.proc.pid)
    assert len(cores) == 1, f"expected one VLLM::EngineCore under serve, found {cores}"

    gateway_reply: dict[str, Any] = {}
    with run_gateway_in_thread(s.grpc_url, s.model) as gw, \
            Client(s.grpc_url, model=s.model, timeout=300) as client:

        def gateway_request() -> None:
            with httpx.Client(timeout=300) as http:
                r = http.post(f"{gw.url}/completions", json={
                    "model": s.model, "prompt": PROMPT, "max_tokens": LONG, "min_tokens": LONG})
            gateway_reply["status"], gateway_reply["body"] = r.status_code, r.json()

        with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as stream:
            chunks = iter(stream)
            next(chunks)  # generating
            thread = threading.Thread(target=gateway_request, daemon=True)
            thread.start()
            wait_engine_gauge(s.metrics_url, lambda v: v >= 2, 60)
            os.kill(cores[0], signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(EngineError) as info:
                for _ in range(LONG):
                    next(chunks)
            assert not isinstance(info.value, InvalidRequest)
            assert time.monotonic() - t0 < 30, "the stream did not fail promptly"
        thread.join(60)
        assert not thread.is_alive(), "the gateway request hung after the engine died"

        # Not ready within 10 s of the kill, and a new request fails fast with a typed error.
        while s.ready():
            assert time.monotonic() - t0 < 10, "/v2/health/ready still answers 200 10 s after the engine died"
            time.sleep(0.1)
        not_ready_after = time.monotonic() - t0
        t1 = time.monotonic()
        with pytest.raises((ModelNotReady, ServerUnavailable)) as refused:
            client.complete(PROMPT, max_tokens=4)
        refused_in = time.monotonic() - t1
    assert refused_in < 10, f"a request after the engine died took {refused_in:.1f} s to fail"
    assert 500 <= gateway_reply["status"] < 600, gateway_reply
    error = gateway_reply["body"]["error"]
    assert error["type"] == "server_error" and error["message"], error

    # serve restarts the server: it serves again.
    s.wait_ready(600)
    back_after = time.monotonic() - t0
    with Client(s.grpc_url, model=s.model, timeout=120) as client:
        assert client.complete(PROMPT, max_tokens=8, min_tokens=8).text
    print(f"\nengine killed: stream EngineError, gateway HTTP {gateway_reply['status']} "
          f"({error.get('code')}); not ready after {not_ready_after:.1f} s; a new request "
          f"failed with {type(refused.value).__name__} in {refused_in:.2f} s; serving again "
          f"after {back_after:.0f} s; load average {os.getloadavg()[0]:.2f}")


def _tritonservers(serve_pid: int) -> list[int]:
    return _named(serve_pid, "tritonserver\n")


def test_a_crashed_tritonserver_is_started_again_by_serve(served: ServeProcess) -> None:
    """tritonserver itself dies (SIGSEGV, as an upstream crash would): ``serve`` does not
    give up; it clears the dead server's process group and starts a new tritonserver, which
    serves. The oracle is the operating system: a different tritonserver process under
    ``serve``, and no process of the old one's group left."""
    s = served
    s.wait_ready(600)
    before = _tritonservers(s.proc.pid)
    assert len(before) == 1, before
    old_group = os.getpgid(before[0])
    os.kill(before[0], signal.SIGSEGV)
    t0 = time.monotonic()
    while s.ready():
        assert time.monotonic() - t0 < 10, "still ready 10 s after tritonserver was killed"
        time.sleep(0.1)
    s.wait_ready(600)
    back_after = time.monotonic() - t0
    assert s.proc.poll() is None, "serve exited instead of starting tritonserver again"
    after = _tritonservers(s.proc.pid)
    assert len(after) == 1 and after != before, (before, after)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(old_group, 0)
        raise AssertionError(f"processes of the crashed server's group {old_group} survived")
    with Client(s.grpc_url, model=s.model, timeout=120) as client:
        assert client.complete(PROMPT, max_tokens=8, min_tokens=8).text
    print(f"\ntritonserver SIGSEGV: serving again after {back_after:.0f} s "
          f"(pid {before[0]} -> {after[0]}); load average {os.getloadavg()[0]:.2f}")


def _stubs_of(serve_pid: int, model: str) -> list[int]:
    """Python-backend stub processes under ``serve_pid`` serving instances of ``model``."""
    pids = []
    for pid in descendants(serve_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"triton_python_backend_stub") and argv[8].decode().startswith(f"{model}_0_"):
            pids.append(pid)
    return pids


def test_a_stub_stalled_past_the_health_deadline_makes_serve_start_the_server_again(served: ServeProcess) -> None:
    """Triton 2.51's Python backend gives a stub 1 s to show it is alive while it waits on it;
    a stub that was stopped longer (here: SIGSTOP for 2.5 s, as memory reclaim or a stopped
    virtual CPU would) is declared unhealthy, and its late reply is taken as the answer to the
    model's next request -- which crashed tritonserver when tried here (an empty error, then
    SIGSEGV on the request after). The ``_sync`` model is stalled while its two instances
    each forward a request: those requests fail as a server error (not a refused request);
    then, with no further request, the stub's stall watcher asks ``serve`` to start the server
    again, which it does; afterwards both ``_sync`` and the ensemble answer exactly as before
    the stall. Oracles: the operating system's stop/continue of the real stub processes,
    ``serve``'s own restart, and the answers the same server gave before."""
    s = served
    s.wait_ready(600)
    sync = f"{s.model}_sync"
    with Client(s.grpc_url, model=sync, timeout=120) as client:
        before_sync = client.complete(PROMPT, max_tokens=16).text
    with Client(s.grpc_url, model=s.model, timeout=120) as client:
        before = client.complete(PROMPT, max_tokens=16).text
    stubs = _stubs_of(s.proc.pid, sync)
    assert len(stubs) == 2, stubs
    said_before = s.output().count("restarting tritonserver")
    said_again = s.output().count("ready again")

    failures: list[TritonForgeError] = []

    def forward() -> None:
        try:
            with Client(s.grpc_url, model=sync, timeout=300) as client:
                client.complete(PROMPT, max_tokens=LONG, min_tokens=LONG)
        except TritonForgeError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=forward, daemon=True) for _ in stubs]
    for t in threads:
        t.start()
    wait_engine_gauge(s.metrics_url, lambda v: v >= 2, 60)
    for pid in stubs:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(2.5)
    for pid in stubs:
        os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    for t in threads:
        t.join(300)
    assert len(failures) == 2, f"the stalled requests did not fail: {failures}"
    for exc in failures:
        assert isinstance(exc, (ServerError, ServerUnavailable)) and not isinstance(exc, InvalidRequest), repr(exc)

    # serve starts the server again by itself (no request needed to set the crash off)
    while s.output().count("restarting tritonserver") == said_before:
        assert time.monotonic() - t0 < 30, f"serve did not restart after the stall:\n{s.output()[-2000:]}"
        time.sleep(0.2)
    asked_after = time.monotonic() - t0
    assert "stalled" in s.output().split("restarting tritonserver")[-2].splitlines()[-1]
    while s.output().count("ready again") == said_again:
        assert s.proc.poll() is None, s.output()[-2000:]
        assert time.monotonic() - t0 < 600, f"serve did not come back:\n{s.output()[-2000:]}"
        time.sleep(0.5)
    s.wait_ready(60)
    back_after = time.monotonic() - t0
    with Client(s.grpc_url, model=sync, timeout=120) as client:
        assert client.complete(PROMPT, max_tokens=16).text == before_sync
        assert client.complete(PROMPT, max_tokens=16).text == before_sync  # the second one crashed
    with Client(s.grpc_url, model=s.model, timeout=120) as client:
        assert client.complete(PROMPT, max_tokens=16).text == before
    print(f"\n_sync stubs stopped 2.5 s mid-request: both requests failed "
          f"({sorted({type(e).__name__ for e in failures})}); serve restarted "
          f"{asked_after:.1f} s after, serving again after {back_after:.0f} s with the same answers; "
          f"load average {os.getloadavg()[0]:.2f}")
