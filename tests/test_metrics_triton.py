"""EngineMetrics inside the real bundled tritonserver: what appears on ``/metrics``.

A small Python-backend model (numpy only, no engine) records a fixed set of values through
:class:`EngineMetrics`; the test scrapes the server's metrics port and checks the series
match, value for value, what the in-memory store predicts for the same calls. This proves
the names survive Triton unchanged, histograms work on this server, and label sets are right.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonforge.backends import metrics as m
from tritonforge.backends.metrics import EngineMetrics

MODEL = "metrics_probe"

MODEL_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.backends.metrics import EngineMetrics


class TritonPythonModel:
    def initialize(self, args):
        self.metrics = EngineMetrics(args["model_name"], args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            v = float(x.reshape(-1)[0])
            record(self.metrics, v)
            self.metrics.flush()
            flag = np.array([1.0 if self.metrics.in_triton else 0.0], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IN_TRITON", flag)]))
        return responses

    def finalize(self):
        self.metrics.close()


RECORD
'''

RECORD = '''
def record(metrics, v):
    metrics.observe_ttft(v)
    metrics.observe_time_per_output_token(v / 10)
    metrics.observe_e2e(v * 10)
    metrics.add_prompt_tokens(7)
    metrics.add_generation_tokens(5)
    metrics.set_running(3)
    metrics.set_waiting(2)
    metrics.set_kv_cache_usage(0.25)
    metrics.add_request_finished("stop" if v < 1 else "length")
'''

CONFIG = f'''
name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "IN_TRITON", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
'''

# Exactly representable in FP32 (the input type), so the model and the in-memory model
# observe identical values; 0.5 sits on a bucket bound (le is inclusive on both sides).
VALUES = (0.00390625, 0.5, 0.625, 2.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    http: str
    metrics: str


def _server_layout(dst: Path) -> Path:
    """A writable copy of the tritonserver bundled in nvidia-pytriton, stub included."""
    try:
        import pytriton  # type: ignore[import-untyped]
    except ImportError:
        pytest.fail("nvidia-pytriton is not installed: run scripts/setup.sh")
    bundled = Path(pytriton.__file__).parent / "tritonserver"
    shutil.copytree(bundled, dst, symlinks=True)
    stub = bundled / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
    shutil.copy2(stub / "triton_python_backend_stub", dst / "backends" / "python")
    return dst


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("metrics_probe")
    server_dir = _server_layout(root / "tritonserver")
    repo = root / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    (repo / MODEL / "1" / "model.py").write_text(MODEL_PY.replace("RECORD", RECORD))
    import pytriton

    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(sysconfig.get_config_var("LIBDIR")), str(libs), env.get("LD_LIBRARY_PATH", "")]
    )
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [
            str(server_dir / "bin" / "tritonserver"),
            f"--model-repository={repo}",
            f"--backend-directory={server_dir / 'backends'}",
            f"--cache-directory={server_dir / 'caches'}",
            "--http-address=127.0.0.1", f"--http-port={http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
            "--allow-metrics=true", "--allow-cpu-metrics=true", "--metrics-interval-ms=200",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"tritonserver exited {proc.returncode}:\n"
                            + (root / "server.log").read_text()[-4000:])
            try:
                if _get(f"http://127.0.0.1:{http}/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("tritonserver not ready in 120 s:\n"
                            + (root / "server.log").read_text()[-4000:])
            time.sleep(0.3)
        yield Server(http=f"127.0.0.1:{http}", metrics=f"127.0.0.1:{metrics}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _infer(server: Server, value: float) -> float:
    body = json.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [value]}]}
    ).encode()
    req = urllib.request.Request(
        f"http://{server.http}/v2/models/{MODEL}/infer", data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        out = json.loads(resp.read())
    return float(out["outputs"][0]["data"][0])


Key = tuple[str, frozenset[tuple[str, str]]]


def _normalise(name: str, labels: dict[str, str]) -> Key:
    if "le" in labels:
        labels = {**labels, "le": repr(float(labels["le"]))}
    return name, frozenset(labels.items())


def _scrape_engine(server: Server) -> dict[Key, float]:
    status, body = _get(f"http://{server.metrics}/metrics")
    assert status == 200
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.startswith("tritonforge_engine_"):
                out[_normalise(s.name, dict(s.labels))] = s.value
    return out


def test_engine_metrics_on_triton_match_the_in_memory_model(probe_server: Server) -> None:
    before = _scrape_engine(probe_server)
    # Created at initialize(): every series exists before any request, all zero.
    assert {n for n, _ in before} == m.ENGINE_METRIC_NAMES
    assert all(v == 0 for v in before.values())

    for v in VALUES:
        assert _infer(probe_server, v) == 1.0  # the model saw pb_utils: the Triton path ran

    expected_em = EngineMetrics(MODEL, "1")
    namespace: dict[str, object] = {}
    exec(RECORD, namespace)  # noqa: S102 - our own constant: the very calls the model made
    for v in VALUES:
        namespace["record"](expected_em, v)  # type: ignore[operator]
    expected = {_normalise(n, dict(lab)): val for (n, lab), val in expected_em.samples().items()}

    got = _scrape_engine(probe_server)
    assert set(got) == set(expected), (
        f"missing: {sorted(set(expected) - set(got))[:5]}, extra: {sorted(set(got) - set(expected))[:5]}"
    )
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-6, abs_tol=1e-9), (key, got[key], value)
    # and they moved
    assert got[_normalise(m.GENERATION_TOKENS, {"model": MODEL, "version": "1"})] == 20
    assert got[_normalise(f"{m.TTFT}_count", {"model": MODEL, "version": "1"})] == len(VALUES)


def test_engine_metric_families_have_prometheus_types(probe_server: Server) -> None:
    status, body = _get(f"http://{probe_server.metrics}/metrics")
    assert status == 200
    kinds = {
        f.name: f.type
        for f in text_string_to_metric_families(body.decode())
        if f.name.startswith("tritonforge_engine_")
    }
    for name in m.HISTOGRAMS:
        assert kinds.get(name) == "histogram", (name, kinds)
    for name in (m.REQUESTS_RUNNING, m.REQUESTS_WAITING, m.KV_CACHE_USAGE):
        assert kinds.get(name) == "gauge", (name, kinds)
    for name in (m.PROMPT_TOKENS, m.GENERATION_TOKENS, m.REQUESTS_FINISHED):
        # the parser strips the _total suffix of counter families
        assert kinds.get(name.removesuffix("_total")) == "counter", (name, kinds)
