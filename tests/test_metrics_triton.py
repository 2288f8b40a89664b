"""EngineMetrics inside the real bundled tritonserver: what appears on ``/metrics``.

A small Python-backend model (numpy only, no engine) records a fixed set of values through
:class:`EngineMetrics`; the test scrapes the server's metrics port and checks the series
match, value for value, what the in-memory store predicts for the same calls. This proves
the names survive Triton unchanged, histograms work on this server, and label sets are right.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonforge.runtime.server import ServerError, ServerOptions, free_port, running
from tritonforge.triton_models import metrics as m
from tritonforge.triton_models.metrics import EngineMetrics

MODEL = "metrics_probe"

MODEL_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from tritonforge.triton_models.metrics import EngineMetrics
from tritonforge.runtime.server import ServerError, ServerOptions, free_port, running


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


@dataclass
class Server:
    http: str
    metrics: str


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("metrics_probe")
    repo = root / "repo"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    (repo / MODEL / "1" / "model.py").write_text(MODEL_PY.replace("RECORD", RECORD))
    options = ServerOptions(
        repository=repo, http_port=free_port(), grpc_port=free_port(),
        metrics_port=free_port(), log_file=root / "server.log",
        extra_args=["--metrics-interval-ms=200"],
    )
    try:
        with running(options, timeout=120) as server:
            yield Server(http=options.http_url, metrics=options.metrics_url)
            assert server.process is not None and server.process.poll() is None
    except ServerError as exc:
        pytest.fail(str(exc))


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
    # Created at initialize(): every series exists before any request, all zero but the
    # engine-up gauge (1 until the engine dies).
    assert {n for n, _ in before} == m.ENGINE_METRIC_NAMES
    assert all(v == (1 if n == m.ENGINE_UP else 0) for (n, _), v in before.items())

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
