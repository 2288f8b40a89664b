"""A known intermittent abort of Triton's Python backend at start-up is retried, nothing else.

Triton 2.51's Python backend sometimes aborts while models load on a loaded machine
(``boost::interprocess::lock_exception``; upstream server#8882), or loses a stub's start-up
handshake and waits forever (a silent log). ``TritonServer.start_ready`` (what ``serve`` and
the test fixtures use) starts again on those only. The abort
cannot be provoked on demand, so the first start here runs a wrapper in place of the
binary that prints the abort's message and exits as an abort does (a stand-in for that one
failed start, and only that); the next start execs the real bundled tritonserver, on an
empty repository, and must become ready. A start failing any other way is not retried.

The lost handshake can be provoked: the backend gives a starting stub 1 s to show it is
alive, so a stub stopped (SIGSTOP) for 3 s while its model initializes is declared
unhealthy, and the real backend then waits in wait4() for it for ever. start_ready() must
see that wait in /proc and start again within seconds, not after minutes of silence.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import descendants
from tritonforge.runtime.server import (
    STUB_WAIT_SECONDS,
    ServerError,
    ServerOptions,
    TritonServer,
    find_install,
    free_port,
)


def _wrapper(tmp: Path, first_run: str) -> tuple[Path, Path]:
    real = find_install().binary
    count = tmp / "starts"
    script = tmp / "tritonserver"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo x >> "{count}"\n'
        f'if [ "$(wc -l < "{count}")" -eq 1 ]; then\n{first_run}\nfi\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return script, count


def _server(tmp: Path, binary: Path) -> TritonServer:
    repo = tmp / "empty-repo"
    repo.mkdir()
    install = dataclasses.replace(find_install(), binary=binary)
    opts = ServerOptions(repository=repo, http_port=free_port(), grpc_port=free_port(),
                         metrics_port=free_port(), restrict_admin=False, log_file=tmp / "server.log")
    return TritonServer(opts, install=install)


def test_the_known_python_backend_abort_is_retried(tmp_path: Path) -> None:
    script, count = _wrapper(tmp_path, (
        "  echo \"terminate called after throwing an instance of 'boost::interprocess::lock_exception'\"\n"
        "  echo '  what():  boost::interprocess::lock_exception'\n"
        "  exit 134"))
    server = _server(tmp_path, script)
    try:
        server.start_ready(timeout=120)
        assert server.is_ready()
        assert server.restarts_after_crash == 1
        assert len(count.read_text().splitlines()) == 2
    finally:
        server.stop()


def test_a_start_that_stalls_is_retried(tmp_path: Path) -> None:
    # The first start says nothing and never becomes ready (a stand-in for the backend's
    # lost stub handshake, which cannot be provoked on demand).
    script, count = _wrapper(tmp_path, "  exec sleep 120")
    server = _server(tmp_path, script)
    try:
        server.start_ready(timeout=120, stall_seconds=3)
        assert server.is_ready()
        assert server.restarts_after_crash == 1
        assert len(count.read_text().splitlines()) == 2
    finally:
        server.stop()


def test_other_start_failures_are_not_retried(tmp_path: Path) -> None:
    script, count = _wrapper(tmp_path, "  echo 'error: something else went wrong'\n  exit 1")
    server = _server(tmp_path, script)
    try:
        with pytest.raises(ServerError, match="something else went wrong"):
            server.start_ready(timeout=120)
        assert server.restarts_after_crash == 0
        assert len(count.read_text().splitlines()) == 1
    finally:
        server.stop()


SLOW_MODEL = """
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)  # long enough for the test to stop this stub mid-start

    def execute(self, requests):
        return []
"""


def _stub_pids(server_pid: int, model: str) -> list[int]:
    pids = []
    for pid in descendants(server_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"triton_python_backend_stub") and f"/{model}/1/model.py".encode() in argv[1]:
            pids.append(pid)
    return pids


def test_a_stub_declared_unhealthy_at_start_is_restarted_at_once(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (repo / "slow" / "config.pbtxt").write_text(
        'name: "slow"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "x", data_type: TYPE_INT32, dims: [1] }]\n'
        'output [{ name: "y", data_type: TYPE_INT32, dims: [1] }]\n'
        'instance_group [{ kind: KIND_CPU, count: 1 }]\n')
    opts = ServerOptions(repository=repo, http_port=free_port(), grpc_port=free_port(),
                         metrics_port=free_port(), restrict_admin=False, log_file=tmp_path / "server.log")
    server = TritonServer(opts)
    stopped: list[int] = []

    def stop_the_first_stub() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stopped:
            proc = server.process
            pids = _stub_pids(proc.pid, "slow") if proc is not None else []
            if pids:
                time.sleep(0.5)  # it is running initialize() (the sleep) by now
                os.kill(pids[0], signal.SIGSTOP)
                stopped.append(pids[0])
                time.sleep(3)
                os.kill(pids[0], signal.SIGCONT)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stop_the_first_stub, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        server.start_ready(timeout=300)
        took = time.monotonic() - started
        thread.join(5)
        assert stopped, "the stub was never seen"
        assert server.is_ready()
        assert server.restarts_after_crash == 1
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert log.count('loading: slow:1') == 2, log[-3000:]
        # seconds, not the STALL_SECONDS of silence: the wait, a stop, a clean start
        assert took < STUB_WAIT_SECONDS + 90, took
        print(f"\nstub {stopped[0]} stopped 3 s at start: ready after a restart in {took:.1f} s "
              f"(load average {os.getloadavg()[0]:.2f})")
    finally:
        server.stop()
