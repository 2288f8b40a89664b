"""The Grafana dashboard's queries against what the project really emits.

* Static: every PromQL expression parses, and every metric it selects is one the project
  emits: tritonforge's engine metrics (``triton_models/metrics.py``), the load-test exporter
  (``loadtests/prom.py``), Triton's own ``nv_inference_*`` (checked against a real scrape
  below) and TensorRT-LLM's ``nv_trt_llm_*`` (GPU only; their names and label values are the
  TensorRT-LLM backend's documented ones).
* Live (the real server): real requests, a scrape of Triton's metrics port showing each
  server-side metric the dashboard queries exists and moved, then a real Prometheus (Debian's
  package) on loopback with the repository's scrape config -- retargeted to the test
  server and a load-test exporter fed with the requests' client-side timings -- answering
  every non-TensorRT-LLM dashboard query with data.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from tritonforge.triton_models import metrics as engine
from tritonforge.contract import MODEL_VLLM_ENGINE
from tritonforge.loadtests import prom
from tritonforge.loadtests.prom import start_exporter

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tritonforge.json"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# Triton core metrics (per model, labels model/version; failure also has reason), as seen on
# a scrape of the bundled tritonserver 2.51; the live test re-checks them.
TRITON_MODEL_METRICS: frozenset[str] = frozenset({
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
})
# TensorRT-LLM backend gauges: name -> (label carrying the kind, its documented values).
TRTLLM_METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "nv_trt_llm_request_metrics": (
        "request_type", frozenset({"active", "max", "scheduled", "context", "waiting"})),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type", frozenset({"max", "free", "used", "tokens_per", "fraction"})),
    "nv_trt_llm_inflight_batcher_metrics": (
        "inflight_batcher_specific_metric",
        frozenset({"micro_batch_id", "generation_requests", "total_context_tokens",
                   "paused_requests", "scheduled_requests"})),
}
# Labels each family carries (besides le on histogram buckets).
_LABELS: dict[str, set[str]] = {
    **{n: {"model", "version"} for n in TRITON_MODEL_METRICS},
    "nv_inference_request_failure": {"model", "version", "reason"},
    **{n: {"model", "version", lab} for n, (lab, _) in TRTLLM_METRICS.items()},
    **{n: {"model", "version"} for n in engine.ENGINE_METRIC_NAMES},
    engine.REQUESTS_FINISHED: {"model", "version", "finish_reason"},
    **{n: {"model"} for n in prom.LOADTEST_METRIC_NAMES},
    prom.METRIC_REQUESTS: {"model", "outcome"},
}
EMITTED: frozenset[str] = frozenset(_LABELS)


def _substitute(expr: str, rate_interval: str = "1m") -> str:
    """Grafana's variables as Grafana expands them for "All"."""
    return expr.replace("$__rate_interval", rate_interval).replace("$model", ".*")


@dataclass
class Selector:
    name: str
    labels: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (op, value)


def _selectors(node: Any) -> Iterator[Selector]:
    """Every vector selector of a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        labels = {m.name: (str(m.op), m.value) for m in node.matchers.matchers}
        name = node.name or labels.pop("__name__", ("", ""))[1]
        yield Selector(name, labels)
    elif isinstance(node, promql_parser.MatrixSelector):
        yield from _selectors(node.vector_selector)
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _selectors(node.lhs)
        yield from _selectors(node.rhs)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _selectors(arg)
    elif isinstance(node, promql_parser.AggregateExpr):
        yield from _selectors(node.expr)
        if node.param is not None:
            yield from _selectors(node.param)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr,
                           promql_parser.SubqueryExpr)):
        yield from _selectors(node.expr)


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str
    names: frozenset[str]

    @property
    def trtllm(self) -> bool:
        return any(n.startswith("nv_trt_llm_") for n in self.names)

    @property
    def server_side(self) -> frozenset[str]:
        return frozenset(n for n in self.names if not n.startswith("tritonforge_loadtest_"))


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _queries() -> list[Query]:
    out = []
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            parsed = promql_parser.parse(_substitute(target["expr"]))
            names = frozenset(s.name for s in _selectors(parsed))
            out.append(Query(panel["title"], target["expr"], names))
    return out


# -- static ---------------------------------------------------------------------------------
def test_every_expression_parses_and_selects_emitted_metrics() -> None:
    queries = _queries()
    assert len(queries) >= 20
    for q in queries:
        assert q.names, f"{q.panel}: {q.expr} selects no metric"
        unknown = q.names - EMITTED
        assert not unknown, f"{q.panel}: {q.expr} queries metrics nobody emits: {unknown}"


def test_label_matchers_use_labels_the_metrics_have() -> None:
    for q in _queries():
        for sel in _selectors(promql_parser.parse(_substitute(q.expr))):
            allowed = _LABELS[sel.name] | ({"le"} if sel.name.endswith("_bucket") else set())
            assert set(sel.labels) <= allowed, (q.panel, sel.name, sel.labels)
            assert "model" in sel.labels, f"{q.panel}: {sel.name} is not filtered by $model"
            if sel.name in TRTLLM_METRICS:
                label, values = TRTLLM_METRICS[sel.name]
                _op, value = sel.labels[label]
                wanted = set(value.split("|"))
                assert wanted <= values, (q.panel, sel.name, wanted - values)


def test_histograms_are_quantiles_of_rates_by_le() -> None:
    for q in _queries():
        if any(n.endswith("_bucket") for n in q.names):
            assert q.expr.startswith("histogram_quantile("), q.expr
            assert "le)" in q.expr and "rate(" in q.expr, q.expr


def test_dashboard_covers_the_required_views() -> None:
    names = set().union(*(q.names for q in _queries()))
    required = {
        "nv_inference_request_success", "nv_inference_request_failure",
        "nv_inference_pending_request_count",
        f"{engine.TTFT}_bucket", f"{engine.TIME_PER_OUTPUT_TOKEN}_bucket",
        engine.GENERATION_TOKENS, engine.REQUESTS_WAITING, engine.KV_CACHE_USAGE,
        "nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics",
        f"{prom.METRIC_TTFT}_bucket", f"{prom.METRIC_ITL}_bucket", prom.METRIC_OUTPUT_TOKENS,
        prom.METRIC_REQUESTS,
    }
    assert required <= names, required - names
    exprs = " ".join(q.expr for q in _queries())
    for quantile in ("histogram_quantile(0.5,", "histogram_quantile(0.95,"):
        assert quantile in exprs


def test_dashboard_shape() -> None:
    dash = _dashboard()
    assert dash["uid"] == "tritonforge"
    var = {v["name"]: v for v in dash["templating"]["list"]}["model"]
    assert var["includeAll"] and var["multi"] and var["allValue"] == ".*"
    var_expr = var["query"]["query"]
    assert var_expr.startswith("label_values(") and "nv_inference_request_success" in var_expr
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(g["y"] + dy, g["x"] + dx) for dy in range(g["h"]) for dx in range(g["w"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and p.get("description"), p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))


# -- live: the real server, a real Prometheus ---------------------------------------------------
def _hostport(url: str) -> str:
    parsed = urllib.parse.urlsplit(url if "//" in url else f"//{url}")
    assert parsed.hostname and parsed.port, url
    return f"{parsed.hostname}:{parsed.port}"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _scrape(metrics_hostport: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Series by name exactly as exposed (Prometheus stores these names; prometheus_client's
    parser would rename counters lacking ``_total``)."""
    text = httpx.get(f"http://{metrics_hostport}/metrics", timeout=10).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        out.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), float(value)))
    return out


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, [])
               if all(lab.get(k) == want for k, want in labels.items()))


@dataclass
class Traffic:
    before: dict[str, list[tuple[dict[str, str], float]]]
    after: dict[str, list[tuple[dict[str, str], float]]]
    exporter: prom.Exporter
    ok: int
    failed: int


def _stream(http: str, model: str, prompt: str, max_tokens: int,
            exporter: prom.Exporter) -> bool:
    """One streamed generation over HTTP SSE, timed on the client like the load test does."""
    start = time.perf_counter()
    last = None
    tokens = 0
    body = {"text_input": prompt, "max_tokens": max_tokens}
    with httpx.stream("POST", f"http://{http}/v2/models/{model}/generate_stream",
                      json=body, timeout=120) as resp:
        if resp.status_code != 200:
            resp.read()
            exporter.add_request(success=False)
            return False
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                exporter.add_request(success=False)
                return False
            now = time.perf_counter()
            raw = event.get("num_output_tokens", 0)
            n = int(raw[0] if isinstance(raw, list) else raw)
            if n and last is None:
                exporter.observe_ttft(now - start)
            elif n and last is not None:
                exporter.observe_itl((now - last) / n)
            if n:
                last = now
                tokens += n
    exporter.add_output_tokens(tokens)
    exporter.add_request(success=tokens > 0)
    return tokens > 0


@pytest.fixture(scope="module")
def traffic(triton_server: Any) -> Iterator[Traffic]:
    metrics = _hostport(triton_server.metrics_url)
    http = _hostport(triton_server.http_url)
    before = _scrape(metrics)
    with start_exporter(0, model=triton_server.model, host="127.0.0.1") as exporter:
        exporter.set_users(1)
        ok = sum(_stream(http, triton_server.model, p, 8, exporter)
                 for p in ("Once upon a time", "The capital of France is", "1, 2, 3,"))
        # One request the server must refuse (max_tokens below the limit): moves the failures.
        bad = httpx.post(f"http://{http}/v2/models/{triton_server.model}/generate_stream",
                         json={"text_input": "x", "max_tokens": 0}, timeout=60)
        failed = 0 if bad.status_code == 200 and "error" not in bad.text else 1
        time.sleep(1.0)  # the engine's metrics thread applies its queue asynchronously
        after = _scrape(metrics)
        yield Traffic(before, after, exporter, ok, failed)


def test_server_metrics_the_dashboard_queries_exist_and_moved(
    traffic: Traffic, triton_server: Any,
) -> None:
    assert traffic.ok == 3 and traffic.failed == 1
    server_names = set().union(*(q.server_side for q in _queries() if not q.trtllm))
    missing = sorted(n for n in server_names if n not in traffic.after)
    assert not missing, f"the dashboard queries metrics the server does not expose: {missing}"
    assert TRITON_MODEL_METRICS <= set(traffic.after), TRITON_MODEL_METRICS - set(traffic.after)

    ens, eng = triton_server.model, MODEL_VLLM_ENGINE

    def moved(name: str, **labels: str) -> float:
        return _total(traffic.after, name, **labels) - _total(traffic.before, name, **labels)

    assert moved("nv_inference_request_success", model=ens) >= 3
    assert moved("nv_inference_request_failure", model=ens) >= 1
    assert moved("nv_inference_count", model=ens) >= 3
    assert moved("nv_inference_exec_count", model=eng) >= 3
    assert moved("nv_inference_request_duration_us", model=ens) > 0
    assert moved("nv_inference_queue_duration_us", model=eng) > 0
    assert "nv_inference_pending_request_count" in traffic.after
    for name in (f"{engine.TTFT}_count", f"{engine.TIME_PER_OUTPUT_TOKEN}_count",
                 f"{engine.E2E_LATENCY}_count"):
        assert moved(name, model=eng) >= 3, name
    assert moved(engine.PROMPT_TOKENS, model=eng) >= 3
    assert moved(engine.GENERATION_TOKENS, model=eng) >= 3
    finished = sum(moved(engine.REQUESTS_FINISHED, model=eng, finish_reason=r)
                   for r in ("stop", "length"))
    assert finished >= 3
    for gauge in (engine.REQUESTS_RUNNING, engine.REQUESTS_WAITING, engine.KV_CACHE_USAGE):
        assert any(lab.get("model") == eng for lab, _ in traffic.after[gauge]), gauge
    # the TensorRT-LLM panels stay empty on this engine (they are for the trtllm profile)
    assert not any(n.startswith("nv_trt_llm_") for n in traffic.after)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus_query(base: str, expr: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    body = resp.json()
    assert body["status"] == "success", (expr, body)
    result = body["data"]["result"]
    assert isinstance(result, list)
    return result


@pytest.fixture(scope="module")
def prometheus(traffic: Traffic, triton_server: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: apt-get install -y prometheus")
    # The repository's scrape config, retargeted at the test server and exporter.
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    retarget = {
        "triton": _hostport(triton_server.metrics_url),
        "loadtest": f"127.0.0.1:{traffic.exporter.port}",
    }
    cfg["scrape_configs"] = [job for job in cfg["scrape_configs"] if job["job_name"] in retarget]
    assert len(cfg["scrape_configs"]) == len(retarget), "scrape config lost a job"
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": [retarget[job["job_name"]]]}]
    root = tmp_path_factory.mktemp("prometheus")
    (root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    log = (root / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={root / 'prometheus.yml'}",
         f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail("prometheus exited:\n" + (root / "prometheus.log").read_text()[-3000:])
            try:
                up = _prometheus_query(base, "up == 1")
                if {r["metric"]["job"] for r in up} >= set(retarget):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("prometheus did not scrape both targets in 60 s:\n"
                            + (root / "prometheus.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_real_prometheus_answers_every_dashboard_query(prometheus: str, traffic: Traffic,
                                                       triton_server: Any) -> None:
    # Prometheus starts after the traffic: send a little more so rates see an increase
    # inside the window, then poll (bounded) until every query has data.
    time.sleep(2.5)
    http = _hostport(triton_server.http_url)
    for prompt in ("Hello", "Once upon a time"):
        assert _stream(http, triton_server.model, prompt, 8, traffic.exporter)
    queries = [q for q in _queries() if not q.trtllm]
    pending = {q.expr: q for q in queries}
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        time.sleep(1.0)
        for expr in list(pending):
            if _prometheus_query(prometheus, _substitute(expr, "30s")):
                del pending[expr]
    assert not pending, "no data for: " + "; ".join(f"{q.panel}: {q.expr}" for q in pending.values())
    # and the TensorRT-LLM queries are valid PromQL for Prometheus itself (empty here)
    for q in (q for q in _queries() if q.trtllm):
        assert _prometheus_query(prometheus, _substitute(q.expr, "30s")) == []
    # a value check: the engine's output-token rate is positive after the traffic
    rate = _prometheus_query(
        prometheus, f"sum(rate({engine.GENERATION_TOKENS}[30s]))")
    assert float(rate[0]["value"][1]) > 0
