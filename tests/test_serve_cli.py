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
from typing import Any

import psutil
import pytest
from conftest import chat_prompt_ids
from tritonforge.runtime.server import free_port

ROOT = Path(__file__).resolve().parents[1]
TRITONFORGE = str(Path(sys.executable).parent / "tritonforge")


QUESTION = "What is the capital of France?"


def test_serve_answers_then_stops_without_orphans(vllm_oracle: Any) -> None:
    ports = [free_port(), free_port(), free_port()]
    proc = subprocess.Popen(
        [TRITONFORGE, "serve", "--ask", QUESTION, "--max-tokens", "16",
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
        # the streamed answer: vLLM's own greedy answer (the default spec's temperature is 0)
        answer = vllm_oracle.generate(chat_prompt_ids([{"role": "user", "content": QUESTION}]),
                                      temperature=0, max_tokens=16)["text"]
        assert answer.strip() and f"> {QUESTION}\n{answer}\n" in out, out
        assert "127.0.0.1:%d" % ports[0] in out
        _run_the_printed_commands(out, ports)
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


def _run_the_printed_commands(out: str, ports: list[int]) -> None:
    """Run what serve printed under "try next" as a newcomer would paste it: no admin key in
    the environment, no --model. complete/chat/loadtest must discover the model themselves."""
    block = out.split("try next", 1)[1].splitlines()[1:]
    commands = [ln.strip() for ln in block if ln.startswith("  ") and not ln.strip().startswith("#")]
    assert len(commands) == 3, block
    assert all(f"127.0.0.1:{ports[1]}" in c or f"127.0.0.1:{ports[0]}" in c for c in commands), commands
    env = {k: v for k, v in os.environ.items() if k != "TRITONFORGE_ADMIN_KEY"}
    env["PATH"] = f"{Path(TRITONFORGE).parent}{os.pathsep}{env.get('PATH', '')}"
    for cmd in commands:
        stdin = "Say hi.\n" if " chat" in cmd else None
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=ROOT, env=env,
                              input=stdin, timeout=180)
        text = done.stdout + done.stderr
        assert done.returncode == 0 and "Traceback" not in text, (cmd, text[-2000:])
        assert done.stdout.strip(), (cmd, text[-2000:])
    # The load test too, with no --model, over each transport: short bounded runs.
    for protocol, port in (("grpc", ports[1]), ("http", ports[0])):
        results = ROOT / ".cache" / "test-results" / f"serve-loadtest-{protocol}-{os.getpid()}"
        done = subprocess.run(
            [TRITONFORGE, "loadtest", "--protocol", protocol, "--url", f"127.0.0.1:{port}", "--users", "1",
             "--spawn-rate", "1", "--duration", "5", "--max-tokens", "8", "--output", str(results)],
            capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0 and "Traceback" not in out, (protocol, out[-3000:])


def test_serve_refuses_a_broken_repository(tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository", repo)
    ensemble = next(p for p in repo.glob("*/config.pbtxt") if 'platform: "ensemble"' in p.read_text())
    ensemble.write_text(ensemble.read_text().replace('model_name: "postprocessing"', 'model_name: "postprocesing"', 1))
    proc = subprocess.run([TRITONFORGE, "serve", "--repo", str(repo), "--http-port", str(free_port())],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "postprocesing" in proc.stderr and "tritonforge validate" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "tritonserver" not in proc.stdout  # nothing was started


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
