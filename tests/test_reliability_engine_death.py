"""vLLM's EngineCore process dies under load: what clients see (a server of its own).

The oracle is the operating system: the test SIGKILLs the real ``VLLM::EngineCore``
process, found by walking the server's process tree in /proc, while requests are running.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    DEFAULT_REPO,
    ServerHandle,
    _default_model_name,
    descendants,
    start_server,
    wait_engine_gauge,
)
from tritonforge.clients import Client, EngineError, InvalidRequest
from tritonforge.gateway import run_gateway_in_thread

pytestmark = pytest.mark.server

LONG = 1500  # min_tokens = max_tokens: still generating when the engine is killed
PROMPT = "Once upon a time, there was a little"


@pytest.fixture(scope="module")
def own_server() -> Iterator[ServerHandle]:
    server, handle = start_server(DEFAULT_REPO, log_name="engine-death")
    handle.model = _default_model_name()
    try:
        yield handle
    finally:
        server.stop()  # type: ignore[attr-defined]


def engine_core_pids(server_pid: int) -> list[int]:
    pids = []
    for pid in descendants(server_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::EngineCor"):
                pids.append(pid)
        except OSError:
            continue
    return pids


def test_engine_death_mid_stream_is_an_engine_failure_for_every_client(own_server: ServerHandle) -> None:
    server: Any = own_server.server
    cores = engine_core_pids(server.process.pid)
    assert len(cores) == 1, f"expected one VLLM::EngineCore under the server, found {cores}"

    gateway_reply: dict[str, Any] = {}
    with run_gateway_in_thread(own_server.grpc_url, own_server.model) as gw, \
            Client(own_server.grpc_url, model=own_server.model, timeout=300) as client:

        def gateway_request() -> None:
            with httpx.Client(timeout=300) as http:
                r = http.post(f"{gw.url}/completions", json={
                    "model": own_server.model, "prompt": PROMPT, "max_tokens": LONG,
                    "min_tokens": LONG})
            gateway_reply["status"], gateway_reply["body"] = r.status_code, r.json()

        with client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as stream:
            chunks = iter(stream)
            next(chunks)  # generating
            thread = threading.Thread(target=gateway_request, daemon=True)
            thread.start()
            wait_engine_gauge(own_server.metrics_url, lambda v: v >= 2, 60)
            os.kill(cores[0], signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(EngineError) as info:
                for _ in range(LONG):
                    next(chunks)
            assert not isinstance(info.value, InvalidRequest)
            assert time.monotonic() - t0 < 30, "the stream did not fail promptly"
        thread.join(60)
    assert not thread.is_alive(), "the gateway request hung after the engine died"
    assert 500 <= gateway_reply["status"] < 600, gateway_reply
    error = gateway_reply["body"]["error"]
    assert error["type"] == "server_error" and error["message"], error
    print(f"engine killed: typed client EngineError, gateway HTTP {gateway_reply['status']} "
          f"({error.get('code')})")
