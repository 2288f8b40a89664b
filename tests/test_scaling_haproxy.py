"""Two replicas behind a real load balancer (Debian's haproxy), one killed mid-run.

Two real tritonservers (the bundled one, ``tritonforge.runtime.server.TritonServer``) on
loopback ports, haproxy configured by the project's own ``deploy/haproxy/haproxy.cfg`` (its
addresses from the environment, as the file documents), a bounded Locust run (the project's
locustfile, HTTP SSE users) through it, and typed-client streams open on both replicas when
one replica's whole process tree gets SIGKILL. Judged by independent witnesses: Locust's
own per-second stats history, the typed clients' exceptions, and haproxy's own stats socket.

The replicas serve a stand-in model, not SmolLM2 on vLLM: two vLLM engines plus Locust plus
haproxy do not fit this 2-core machine in a test's time budget, and what is tested here (the
balancer, health checks, failover, error typing) does not depend on the engine. The
stand-in is a decoupled Python model speaking the ensemble's tensor contract
(``contract.ENSEMBLE_INPUTS/OUTPUTS``), so the typed clients and the Locust users talk to it
exactly as to the served ensemble; it streams ``max_tokens`` one-word chunks, one every
``DELAY_MS``, and each replica streams its own word so a stream shows which replica serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonforge.loadtests as loadtests_pkg
from tritonforge import contract
from tritonforge.clients import AsyncClient, TritonForgeError

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
LOCUSTFILE = Path(loadtests_pkg.__file__).resolve().parent / "locustfile.py"
MODEL = "lb_stand_in"
DELAY_MS = 100
WORDS = {"replica1": " alpha", "replica2": " beta"}


_MODEL_PY = '''\
"""Stand-in engine for the load-balancer test (see tests/test_scaling_haproxy.py): streams
max_tokens chunks of one word, one every delay_ms, in the ensemble's output tensors."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.word = np.array([[params["word"]["string_value"].encode()]], dtype=object)
        self.delay = int(params["delay_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        empty = np.array([[b""]], dtype=object)
        length = np.array([[b"length"]], dtype=object)
        one = np.array([[1]], dtype=np.int32)
        for request in requests:
            sender = request.get_response_sender()
            mt = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            n = int(mt.as_numpy().reshape(-1)[0]) if mt is not None else 16
            for i in range(n):
                time.sleep(self.delay)
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", self.word),
                    pb_utils.Tensor("finish_reason", length if i == n - 1 else empty),
                    pb_utils.Tensor("num_input_tokens", one),
                    pb_utils.Tensor("num_output_tokens", one),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _tensors(kind: str, tensors: tuple[contract.Tensor, ...]) -> str:
    rows = []
    for t in tensors:
        optional = "\n    optional: true" if kind == "input" and t.optional else ""
        rows.append(f'  {{\n    name: "{t.name}"\n    data_type: {t.dtype.value}\n'
                    f"    dims: [ {', '.join(map(str, t.dims))} ]{optional}\n  }}")
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def write_repository(root: Path, word: str) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(_MODEL_PY)
    (root / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: 8\n'
        "model_transaction_policy { decoupled: true }\n"
        + _tensors("input", contract.ENSEMBLE_INPUTS) + _tensors("output", contract.ENSEMBLE_OUTPUTS)
        # Enough instances that the Locust users and the held streams never queue.
        + "instance_group [ { count: 12, kind: KIND_CPU } ]\n"
        + f'parameters {{ key: "word" value: {{ string_value: "{word}" }} }}\n'
        + f'parameters {{ key: "delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}\n')
    return root


class Haproxy:
    """haproxy running the shipped config, with loopback addresses in its environment."""

    def __init__(self, tmp: Path, replicas: dict[str, Any]) -> None:
        from tritonforge.runtime.server import free_port

        self.http = f"127.0.0.1:{free_port()}"
        self.grpc = f"127.0.0.1:{free_port()}"
        self.stats = f"127.0.0.1:{free_port()}"
        # A short path: unix socket paths are limited to 107 bytes, pytest's tmp_path is long.
        self._sockdir = tempfile.mkdtemp(prefix="tf-lb-")
        self.socket = os.path.join(self._sockdir, "stats.sock")
        env = dict(os.environ, TRITONFORGE_LB_HTTP=self.http, TRITONFORGE_LB_GRPC=self.grpc,
                   TRITONFORGE_LB_STATS=self.stats, TRITONFORGE_LB_SOCKET=self.socket)
        for i, (_, srv) in enumerate(sorted(replicas.items()), start=1):
            env[f"TRITONFORGE_REPLICA_{i}_HOST"] = "127.0.0.1"
            env[f"TRITONFORGE_REPLICA_{i}_HTTP_PORT"] = str(srv.options.http_port)
            env[f"TRITONFORGE_REPLICA_{i}_GRPC_PORT"] = str(srv.options.grpc_port)
        check = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], env=env, check=False,
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = open(tmp / "haproxy.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def show_stat(self) -> list[dict[str, str]]:
        """haproxy's own `show stat` CSV from its stats socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.socket)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode().lstrip("# ").splitlines()
        return list(csv.DictReader(lines))

    def status(self, backend: str) -> dict[str, str]:
        return {r["svname"]: r["status"] for r in self.show_stat()
                if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_status(self, backend: str, want: dict[str, str], seconds: float) -> dict[str, str]:
        deadline = time.monotonic() + seconds
        while True:
            try:
                got = self.status(backend)
            except OSError:  # haproxy still starting: no socket yet
                got = {}
            if all(got.get(k) == v for k, v in want.items()):
                return got
            if time.monotonic() > deadline:
                return got
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self._sockdir, ignore_errors=True)


@contextlib.contextmanager
def replicas(tmp: Path) -> Iterator[dict[str, Any]]:
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    servers: dict[str, Any] = {}
    try:
        for name, word in WORDS.items():
            repo = write_repository(tmp / name, word)
            srv = TritonServer(ServerOptions(
                repository=repo, http_port=free_port(), grpc_port=free_port(),
                metrics_port=free_port(), log_file=tmp / f"{name}.log"))
            srv.start()
            servers[name] = srv
        for srv in servers.values():
            srv.wait_ready(timeout=180)
        yield servers
    finally:
        for srv in servers.values():
            with contextlib.suppress(Exception):
                srv.stop(timeout=10)


def _locust(lb: Haproxy, out: Path, seconds: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-u", "4", "-r", "4", "-t", f"{seconds}s", "--stop-timeout", "10",
           "--protocol", "http", "--model", MODEL, "--triton-http", lb.http,
           "--triton-grpc", lb.grpc, "--max-tokens", "8", "--dataset", "short-chat",
           "--prometheus-port", "-1", "--results-dir", str(out), "--csv", str(out / "locust"),
           "--csv-full-history", "--loglevel", "WARNING"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, MPLBACKEND="Agg"), cwd=out)


def _history(out: Path) -> list[tuple[float, int, int]]:
    """(time, requests, failures) of Locust's aggregated row, one per second."""
    rows = []
    with open(out / "locust_stats_history.csv") as f:
        for r in csv.DictReader(f):
            if r["Name"] == "Aggregated":
                rows.append((float(r["Timestamp"]), int(r["Total Request Count"]),
                             int(r["Total Failure Count"])))
    return rows


async def _hold_streams(lb: Haproxy, kill: Any) -> dict[str, list[str]]:
    """Open streams through the balancer until both replicas serve one, kill replica1, and
    report how each stream ended: 'done' or the typed error's class name, by replica."""
    results: dict[str, list[str]] = {"replica1": [], "replica2": []}
    async with AsyncClient(lb.http, protocol="http", model=MODEL, timeout=60,
                           connect_retries=0) as client:
        streams: list[tuple[str, Any, Any]] = []
        for _ in range(10):  # bounded: leastconn alternates, a few tries suffice
            s = client.stream("hello", max_tokens=120)  # 12 s of streaming
            it = s.__aiter__()
            first = await asyncio.wait_for(it.__anext__(), 10)
            owner = next(k for k, w in WORDS.items() if first.text == w)
            streams.append((owner, s, it))
            if {o for o, _, _ in streams} == set(WORDS):
                break
        assert {o for o, _, _ in streams} == set(WORDS), "haproxy sent every stream to one replica"
        kill()

        async def finish(owner: str, s: Any, it: Any) -> None:
            try:
                while True:
                    try:
                        await it.__anext__()
                    except StopAsyncIteration:
                        break
                results[owner].append("done")
            except TritonForgeError as exc:
                results[owner].append(type(exc).__name__)
            finally:
                await s.aclose()

        await asyncio.wait_for(asyncio.gather(*(finish(*t) for t in streams)), 30)
    return results


@pytest.mark.timeout(240)
def test_two_replicas_behind_haproxy_one_killed_mid_run(tmp_path: Path) -> None:
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: apt-get install -y haproxy (scripts/test.sh does)")
    t_start = time.monotonic()
    with replicas(tmp_path) as servers:
        lb = Haproxy(tmp_path, servers)
        try:
            before = lb.wait_status("triton_http", {"replica1": "UP", "replica2": "UP"}, 20)
            assert before == {"replica1": "UP", "replica2": "UP"}, before
            assert lb.wait_status("triton_grpc", {"replica1": "UP", "replica2": "UP"}, 20) == \
                {"replica1": "UP", "replica2": "UP"}
            out = tmp_path / "locust"
            out.mkdir()
            locust = _locust(lb, out, seconds=24)
            time.sleep(8)  # Locust up and loading both replicas

            killed_at: list[float] = []

            def kill() -> None:
                victim = servers["replica1"].process
                os.killpg(victim.pid, signal.SIGKILL)  # tritonserver and its stubs
                killed_at.append(time.time())

            held = asyncio.run(_hold_streams(lb, kill))
            after = lb.wait_status("triton_http", {"replica1": "DOWN"}, 10)
            grpc_after = lb.wait_status("triton_grpc", {"replica1": "DOWN"}, 10)

            # New requests keep succeeding, over HTTP and gRPC, through the survivor.
            async def probe(url: str, protocol: str) -> list[str]:
                async with AsyncClient(url, protocol=protocol, model=MODEL, timeout=30) as c:
                    texts = []
                    for _ in range(4):
                        done = await c.complete("hi", max_tokens=3)
                        texts.append(done.text)
                    return texts
            http_texts = asyncio.run(probe(lb.http, "http"))
            grpc_texts = asyncio.run(probe(lb.grpc, "grpc"))

            try:
                output, _ = locust.communicate(timeout=90)  # nothing hangs
            except subprocess.TimeoutExpired:
                locust.kill()
                raise AssertionError("Locust did not finish in time") from None
            history = _history(out)
        finally:
            lb.stop()
    elapsed = time.monotonic() - t_start

    print(f"\nheld streams by replica: {held}; haproxy after the kill: http {after}, "
          f"grpc {grpc_after}; probes: {http_texts} / {grpc_texts}")
    kill_t = killed_at[0]
    _, final_req, final_fail = history[-1]
    at_kill = max((r for r in history if r[0] <= kill_t), default=(0.0, 0, 0))
    settled = [r for r in history if r[0] >= kill_t + 4]  # the checks took the replica out
    print(f"Locust: {final_req} requests, {final_fail} failed; at the kill {at_kill[1]} / "
          f"{at_kill[2]}; test {elapsed:.0f} s; load average {os.getloadavg()}")
    # In-flight streams on the killed replica fail with a typed error; the others finish.
    assert held["replica1"] and all(r != "done" for r in held["replica1"]), held
    assert held["replica2"] and all(r == "done" for r in held["replica2"]), held
    # haproxy's own health checks took it out; the survivor stays in.
    assert after["replica1"].startswith("DOWN") and after["replica2"] == "UP", after
    assert grpc_after["replica1"].startswith("DOWN") and grpc_after["replica2"] == "UP"
    assert http_texts == [WORDS["replica2"] * 3] * 4 and grpc_texts == http_texts
    # Locust kept going: requests before and well after the kill, and once the replica was
    # out no new failure (at most the 4 users' in-flight requests failed at the kill).
    assert at_kill[1] >= 8, history
    assert len(settled) >= 3 and settled[-1][1] - settled[0][1] >= 8, history
    assert settled[-1][2] == settled[0][2], history
    assert final_fail <= 4, output[-3000:]
    assert final_req - at_kill[1] >= 8
