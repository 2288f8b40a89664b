"""Locust runs against the real server: every protocol, distributed mode, SLO gates.

Locust runs in subprocesses only (importing it here would monkey-patch pytest's process
with gevent). Runs are short and bounded (each well under 30 s), on loopback.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tritonforge.loadtests as loadtests_pkg
from tritonforge.loadtests import prom
from tritonforge.loadtests.metrics import ENTRY_ITL, ENTRY_LATENCY, ENTRY_TTFT, timing_type
from tritonforge.runtime.server import free_port

LOCUSTFILE = Path(loadtests_pkg.__file__).resolve().parent / "locustfile.py"
ENTRIES = (ENTRY_TTFT, ENTRY_ITL, ENTRY_LATENCY)
BOUND = 30.0  # seconds, per Locust run (start-up + run time + draining in-flight requests)


def _env(server: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    if server is not None and server.admin_key:
        env["TRITONFORGE_ADMIN_KEY"] = server.admin_key
    for k in ("TRITONFORGE_MODEL", "TRITONFORGE_PROTOCOL", "TRITONFORGE_DATASET"):
        env.pop(k, None)
    return env


def _locust(server: Any, out: Path, *extra: str, protocol: str = "grpc", users: int = 2,
            run_time: int = 6, max_tokens: int = 3) -> list[str]:
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(users), "-r", str(users), "-t", f"{run_time}s",
        # requests in flight at the end finish (and count) instead of being dropped
        "--stop-timeout", "15",
        "--protocol", protocol, "--model", server.model,
        "--triton-grpc", server.grpc_url, "--triton-http", server.http_url,
        "--max-tokens", str(max_tokens), "--prometheus-port", "-1",
        "--csv", str(out / "locust"), "--html", str(out / "report.html"),
        *extra,
    ]


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND + 15, env=env,
                          check=False)


def _stats(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    with (out / "locust_stats.csv").open(newline="") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def _summary(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def _assert_complete_run(out: Path, label: str, entries: tuple[str, ...]) -> dict[str, Any]:
    stats = _stats(out)
    for name in entries:
        # one request event per logical request; TTFT / ITL under their own Type
        row = stats[(label if name == ENTRY_LATENCY else timing_type(label), name)]
        assert int(row["Request Count"]) > 0, (name, row)
        assert int(row["Failure Count"]) == 0, (name, row)
        assert float(row["Median Response Time"]) > 0 and float(row["95%"]) > 0
    latency = stats[(label, ENTRY_LATENCY)]
    assert float(latency["Average Content Size"]) > 0  # output tokens per request
    aggregated = stats[("", "Aggregated")]
    assert int(aggregated["Failure Count"]) == 0
    summary = _summary(out)
    assert summary["requests"]["failed"] == 0 and summary["requests"]["succeeded"] > 0
    assert summary["requests"]["succeeded"] == int(latency["Request Count"])
    # N requests are N in Locust's aggregated row (the timing entries do not add to it)
    assert int(aggregated["Request Count"]) == int(latency["Request Count"])
    # ... and each timing entry counted each successful request once
    for name in entries:
        if name != ENTRY_LATENCY:
            assert int(stats[(timing_type(label), name)]["Request Count"]) == int(latency["Request Count"])
    assert summary["output_tokens_total"] > 0
    assert summary["output_token_throughput_per_s"] > 0 and summary["request_throughput_per_s"] > 0
    keys = {ENTRY_TTFT: "time_to_first_token_ms", ENTRY_ITL: "inter_token_latency_ms",
            ENTRY_LATENCY: "request_latency_ms"}
    for name in entries:
        st = summary[keys[name]]
        assert {"p50", "p90", "p95", "p99", "mean"} <= set(st) and st["p50"] > 0
        # the Locust entry holds the same values as the per-request records (mean: exact sum)
        row = stats[(label if name == ENTRY_LATENCY else timing_type(label), name)]
        assert float(row["Average Response Time"]) == pytest.approx(st["mean"], rel=1e-3), (name, row)
    # the CSV and the JSON count the same tokens
    assert summary["output_tokens_total"] == round(
        float(latency["Average Content Size"]) * int(latency["Request Count"]))
    for name in ("report.html", "latency_percentiles.png", "throughput.png"):
        assert (out / name).stat().st_size > 1000, name
    return summary


def test_grpc_streaming_run_with_live_prometheus(triton_server: Any, tmp_path: Path) -> None:
    port = free_port()
    # the later --prometheus-port wins over the helper's -1
    cmd = _locust(triton_server, tmp_path, "--prometheus-port", str(port), protocol="grpc")
    scraped = 0.0
    t0 = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=_env(triton_server)) as proc:
        while proc.poll() is None and time.monotonic() - t0 < BOUND + 15:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    for line in r.read().decode().splitlines():
                        if line.startswith(prom.METRIC_OUTPUT_TOKENS + "{"):
                            scraped = max(scraped, float(line.rsplit(" ", 1)[1]))
            except OSError:
                pass
            time.sleep(0.5)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert time.monotonic() - t0 < BOUND + 15
    summary = _assert_complete_run(tmp_path, "grpc-stream", ENTRIES)
    assert summary["protocol"] == "grpc" and summary["workers"]["count"] == 0
    assert scraped > 0, "the master's exporter never showed output tokens while running"


def test_http_sse_streaming_run(triton_server: Any, tmp_path: Path) -> None:
    res = _run(_locust(triton_server, tmp_path, "--dataset", "mixed-zh-en", protocol="http"),
               _env(triton_server))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = _assert_complete_run(tmp_path, "http-sse", ENTRIES)
    assert summary["dataset"] == "mixed-zh-en" and summary["input_tokens_per_request"]["min"] >= 10


def test_http_non_streaming_run(triton_server: Any, tmp_path: Path) -> None:
    res = _run(_locust(triton_server, tmp_path, protocol="http-sync"), _env(triton_server))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = _assert_complete_run(tmp_path, "http-generate", (ENTRY_TTFT, ENTRY_LATENCY))
    assert (timing_type("http-generate"), ENTRY_ITL) not in _stats(tmp_path)
    assert summary["inter_token_latency_ms"] is None  # undefined for one response per request
    assert summary["time_to_first_token_ms"]["p50"] == pytest.approx(summary["request_latency_ms"]["p50"])


def test_master_and_two_workers(triton_server: Any, tmp_path: Path) -> None:
    port = free_port()
    env = _env(triton_server)
    master = _locust(triton_server, tmp_path, "--master", "--master-bind-host", "127.0.0.1",
                     "--master-bind-port", str(port), "--expect-workers", "2",
                     "--expect-workers-max-wait", "20", run_time=8)
    worker = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker",
              "--master-host", "127.0.0.1", "--master-port", str(port)]
    procs = [subprocess.Popen(master, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)]
    procs += [subprocess.Popen(worker, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                               env=env) for _ in range(2)]
    try:
        _, err = procs[0].communicate(timeout=BOUND + 15)
        for p in procs[1:]:
            p.wait(timeout=20)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 0, err[-3000:]
    summary = _assert_complete_run(tmp_path, "grpc-stream", ENTRIES)
    workers = summary["workers"]
    assert workers["count"] == 2, workers
    assert all(n > 0 for n in workers["records_by_worker"].values()), workers
    assert sum(workers["records_by_worker"].values()) == summary["requests"]["total"]
    assert "2 workers connected" in err or "workers 2" in err


def test_impossible_slo_fails_the_run_through_the_cli(triton_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [sys.executable, "-c", "from tritonforge.cli import main; main()", "loadtest", "--protocol", "grpc",
           "--url", triton_server.grpc_url, "--model", triton_server.model, "--users", "2",
           "--spawn-rate", "2", "--duration", "6", "--max-tokens", "4", "--output", str(out),
           "--slo-ttft-p95-ms", "0.001", "--max-fail-ratio", "0"]
    res = _run(cmd, _env(triton_server))
    assert res.returncode == 3, (res.stdout[-2000:], res.stderr[-2000:])
    assert "SLO gate --slo-ttft-p95-ms FAILED" in res.stdout
    assert "SLO gate --max-fail-ratio passed" in res.stdout
    assert "Traceback" not in res.stderr
    gates = {g["gate"]: g for g in _summary(out)["gates"]}
    assert not gates["--slo-ttft-p95-ms"]["passed"] and gates["--slo-ttft-p95-ms"]["value"] > 0.001
    assert gates["--max-fail-ratio"]["passed"]
    assert "SLO gate --slo-ttft-p95-ms FAILED" in (out / "locust.log").read_text()


def test_refused_requests_are_failures(triton_server: Any, tmp_path: Path) -> None:
    cmd = _locust(triton_server, tmp_path, run_time=4)
    cmd[cmd.index("--model") + 1] = "no_such_model"
    res = _run(cmd, _env(triton_server))
    assert res.returncode == 1, res.stderr[-2000:]  # Locust's exit code for failed requests
    summary = _summary(tmp_path)
    assert summary["requests"]["succeeded"] == 0 and summary["requests"]["failed"] > 0
    assert any("no_such_model" in e for e in summary["errors"]), summary["errors"]
    stats = _stats(tmp_path)
    assert int(stats[("grpc-stream", ENTRY_LATENCY)]["Failure Count"]) > 0
    assert (timing_type("grpc-stream"), ENTRY_TTFT) not in stats


def test_bad_setting_is_one_line_exit_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-t", "2s",
           "--model", "m", "--dataset", str(tmp_path / "missing.jsonl")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=BOUND, env=_env(None),
                         check=False)
    assert res.returncode == 2
    assert "tritonforge loadtest: error: dataset" in res.stderr and "Traceback" not in res.stderr
