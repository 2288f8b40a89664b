"""`tritonforge serve` as a user runs it: serve the default, stream an answer, stop cleanly.

This is the README's first command (with other ports), run as a real subprocess: it must
print a streamed answer, keep serving, and on SIGTERM stop the server and every process it
started (Python backend stubs, vLLM's engine core and workers): no orphans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from tritonforge.runtime.server import free_port

ROOT = Path(__file__).resolve().parents[1]
TRITONFORGE = str(Path(sys.executable).parent / "tritonforge")


def test_serve_answers_then_stops_without_orphans() -> None:
    ports = [free_port(), free_port(), free_port()]
    proc = subprocess.Popen(
        [TRITONFORGE, "serve", "--ask", "What is the capital of France?", "--max-tokens", "16",
         "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    lines: list[str] = []
    serving = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "serving; Ctrl-C to stop" in line:
                serving.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        assert serving.wait(900), "".join(lines[-40:])
        out = "".join(lines)
        assert "ready in" in out
        assert "Paris" in out  # the streamed answer
        assert "127.0.0.1:%d" % ports[0] in out
        descendants = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(p.name() for p in descendants)
        assert "tritonserver" in names and len(descendants) >= 4, names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, "".join(lines[-20:])
        t.join(10)
        assert "stopped" in "".join(lines)
        deadline = time.monotonic() + 15
        alive = [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline()[:2] for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            for p in psutil.Process(os.getpid()).children(recursive=True):
                p.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--repo", "/nonexistent-repo"], "is not a model repository"),
        (["serve", "deployments/missing.yaml"], "does not exist"),
        (["serve", "--http-port", "70000"], "out of range"),
    ],
)
def test_serve_user_errors_are_one_line(args: list[str], message: str) -> None:
    proc = subprocess.run([TRITONFORGE, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
