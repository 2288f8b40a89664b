"""AIPerf and `tritonforge loadtest` (Locust) on the same workload, side by side.

AIPerf (NVIDIA's benchmark tool, genai-perf's successor) speaks the OpenAI API, so it loads
the gateway (`tritonforge serve --openai-port`); Locust's users load Triton itself (gRPC
streaming and HTTP SSE). Both run the same closed-loop workload: C concurrent streams,
synthetic prompts of ISL tokens (each tool makes its own from SmolLM2's tokenizer), exactly
OSL output tokens per request (AIPerf: ``ignore_eos``, which the gateway maps to
``min_tokens``; Locust: ``--ignore-eos``), greedy, for D seconds each, one tool after the
other in ABBA order (AIPerf, Locust gRPC, Locust HTTP, then the reverse), never together.
Prints each run's TTFT p50, ITL p50 and output tok/s (as each tool reports them), the
medians per tool and the ratios to AIPerf, the load average before each run, and checks
every run generated exactly OSL tokens per request.

AIPerf is heavy (its own worker processes; a c=1 run used minutes of CPU on 2 cores and
slowed the server it measured), so it is not a project dependency and this script is not
part of the test suite. Install it in its own environment first:

    python3 -m venv .cache/aiperf-venv && .cache/aiperf-venv/bin/pip install aiperf==0.13.0
    .venv/bin/python benchmarks/compare_aiperf.py --concurrency 1 --duration 60

The server (``tritonforge serve --openai-port``) is started here on free loopback ports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def _free_port() -> int:
    from tritonforge.runtime.server import free_port

    return free_port()


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def engine_counts(metrics_port: int) -> dict[str, float]:
    """Finished requests, generated tokens and the sums/counts of the engine's own TTFT and
    time-per-output-token histograms, from the server's metrics: what the server did and
    how fast, measured by neither tool."""
    import urllib.request

    from tritonforge.triton_models.metrics import (
        GENERATION_TOKENS,
        REQUESTS_FINISHED,
        TIME_PER_OUTPUT_TOKEN,
        TTFT,
    )

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    names = {REQUESTS_FINISHED: "requests", GENERATION_TOKENS: "tokens",
             TTFT + "_sum": "ttft_sum", TTFT + "_count": "ttft_n",
             TIME_PER_OUTPUT_TOKEN + "_sum": "tpot_sum", TIME_PER_OUTPUT_TOKEN + "_count": "tpot_n"}
    total = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in names:
            total[names[name]] += float(line.rsplit(" ", 1)[1])
    return total


def _server_view(a: dict[str, float], b: dict[str, float]) -> tuple[float, float]:
    """The engine's mean TTFT and time per output token (ms) between two scrapes."""
    def mean(s: str, n: str) -> float:
        dn = b[n] - a[n]
        return 1000.0 * (b[s] - a[s]) / dn if dn else float("nan")
    return mean("ttft_sum", "ttft_n"), mean("tpot_sum", "tpot_n")


def start_serve(tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    picked: list[int] = []
    while len(picked) < 4:  # four distinct ports (the OS may hand the same free port twice)
        if (p := _free_port()) not in picked:
            picked.append(p)
    ports = dict(zip(("http", "grpc", "metrics", "openai"), picked, strict=True))
    log = tmp / "serve.log"
    proc = subprocess.Popen(
        [str(VENV_BIN / "tritonforge"), "serve", "--http-port", str(ports["http"]),
         "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
         "--openai-port", str(ports["openai"])],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "serving; Ctrl-C to stop" in text:
            return proc, ports
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(1)
    raise SystemExit("serve was not ready in 900 s")


def run_aiperf(aiperf: Path, ports: dict[str, int], tokenizer: str, a: argparse.Namespace,
               out: Path) -> dict[str, float]:
    cmd = [str(aiperf), "profile", "--model", "smollm2", "--url", f"http://127.0.0.1:{ports['openai']}",
           "--endpoint-type", "completions", "--streaming", "--concurrency", str(a.concurrency),
           "--benchmark-duration", str(a.duration), "--benchmark-grace-period", "60",
           "--synthetic-input-tokens-mean", str(a.isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(a.osl), "--output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"max_tokens:{a.osl}",
           "--extra-inputs", "temperature:0",
           "--tokenizer", tokenizer, "--artifact-dir", str(out), "--ui-type", "none",
           "--no-server-metrics", "--random-seed", "0"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=a.duration + 600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    export = next(out.rglob("profile_export_aiperf.json"), None)
    if export is None:
        raise SystemExit(f"no profile_export_aiperf.json under {out}:\n{done.stdout[-2000:]}")
    data: dict[str, Any] = json.loads(export.read_text())
    return _aiperf_figures(data) | {"wall_s": wall}


def _metric(data: dict[str, Any], name: str) -> dict[str, Any]:
    found = data.get(name)
    if not isinstance(found, dict):
        raise KeyError(f"AIPerf export has no {name!r}: {sorted(data)[:40]}")
    return found


def _aiperf_figures(data: dict[str, Any]) -> dict[str, float]:
    """TTFT/ITL p50, output tok/s, output length range, requests and errors of an export."""
    ttft, itl = _metric(data, "time_to_first_token"), _metric(data, "inter_token_latency")
    osl = _metric(data, "output_sequence_length")
    errors = data.get("error_request_count")  # absent when no request failed
    return {
        "ttft_p50_ms": float(ttft["p50"]), "itl_p50_ms": float(itl["p50"]),
        "tok_s": float(_metric(data, "output_token_throughput")["avg"]),
        "osl_min": float(osl["min"]), "osl_max": float(osl["max"]),
        "requests": float(_metric(data, "request_count")["avg"]),
        "errors": float(errors["avg"]) if isinstance(errors, dict) else 0.0,
    }


def run_locust(protocol: str, ports: dict[str, int], a: argparse.Namespace, out: Path) -> dict[str, float]:
    port = ports["grpc"] if protocol == "grpc" else ports["http"]
    cmd = [str(VENV_BIN / "tritonforge"), "loadtest", "--protocol", protocol, "--url", f"127.0.0.1:{port}",
           "--users", str(a.concurrency), "--spawn-rate", str(a.concurrency), "--duration", str(a.duration),
           "--dataset", f"synthetic:{a.isl}", "--max-tokens", str(a.osl), "--ignore-eos",
           "--output", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=a.duration + 600)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):  # 1: some requests failed (counted and shown below)
        raise SystemExit(f"loadtest failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    s: dict[str, Any] = json.loads((out / "summary.json").read_text())
    if s["errors"]:
        print(f"    loadtest errors: {s['errors']}")
    per_req = s.get("output_tokens_per_request")
    return {
        "ttft_p50_ms": float(s["time_to_first_token_ms"]["p50"]),
        "itl_p50_ms": float(s["inter_token_latency_ms"]["p50"]),
        "tok_s": float(s["output_token_throughput_per_s"]),
        "osl_min": float(per_req["min"]) if per_req else float("nan"),
        "osl_max": float(per_req["max"]) if per_req else float("nan"),
        "requests": float(s["requests"]["succeeded"]), "errors": float(s["requests"]["failed"]),
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", type=Path, default=ROOT / ".cache" / "aiperf-venv" / "bin" / "aiperf")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--duration", type=int, default=60, help="seconds per run")
    ap.add_argument("--isl", type=int, default=64, help="input tokens per prompt")
    ap.add_argument("--osl", type=int, default=32, help="output tokens per request (exact)")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds (each: every side twice)")
    a = ap.parse_args()
    if not a.aiperf.is_file():
        raise SystemExit(f"{a.aiperf} not found; install AIPerf first (see this script's docstring)")
    from tritonforge.runtime.models import resolve_model

    tokenizer = str(resolve_model("package:smollm2-135m-instruct"))
    sides = ["aiperf", "locust-grpc", "locust-http"]
    order = [s for _ in range(a.rounds) for s in sides + sides[::-1]]
    print(f"machine: {os.cpu_count()} CPUs; workload: c={a.concurrency}, ISL {a.isl}, OSL {a.osl} exact,"
          f" {a.duration} s per run; order {' '.join(order)}")
    results: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    tmp = Path(tempfile.mkdtemp(prefix="compare-aiperf-"))
    proc, ports = start_serve(tmp)
    try:
        for i, side in enumerate(order):
            before = load()
            out = tmp / f"{i}-{side}"
            c0 = engine_counts(ports["metrics"])
            r = (run_aiperf(a.aiperf, ports, tokenizer, a, out) if side == "aiperf"
                 else run_locust(side.split("-")[1], ports, a, out))
            c1 = engine_counts(ports["metrics"])
            n0, t0, n1, t1 = c0["requests"], c0["tokens"], c1["requests"], c1["tokens"]
            r["server_ttft_ms"], r["server_tpot_ms"] = _server_view(c0, c1)
            results[side].append(r)
            # Same work on both sides, by the engine's own count: OSL tokens per finished request.
            exact = n1 > n0 and (t1 - t0) == a.osl * (n1 - n0)
            print(f"  {side:12s} load {before}: TTFT p50 {r['ttft_p50_ms']:8.1f} ms  ITL p50"
                  f" {r['itl_p50_ms']:7.2f} ms  {r['tok_s']:7.2f} tok/s  {r['requests']:.0f} requests,"
                  f" {r['errors']:.0f} errors; engine: {n1 - n0:.0f} requests, {t1 - t0:.0f} tokens"
                  f" ({'exactly' if exact else 'NOT'} {a.osl} each); tool counted"
                  f" {r['osl_min']:.0f}-{r['osl_max']:.0f} per request; {r['wall_s']:.0f} s wall;"
                  f" the engine's own mean TTFT {r['server_ttft_ms']:.1f} ms, time per output token"
                  f" {r['server_tpot_ms']:.2f} ms", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(120)
        shutil.rmtree(tmp, ignore_errors=True)
    print("medians (ratio to AIPerf):")
    base = {k: statistics.median(r[k] for r in results["aiperf"]) for k in ("ttft_p50_ms", "itl_p50_ms", "tok_s")}
    for side in sides:
        med = {k: statistics.median(r[k] for r in results[side]) for k in base}
        srv = {k: statistics.median(r[k] for r in results[side]) for k in ("server_ttft_ms", "server_tpot_ms")}
        print(f"  {side:12s} TTFT p50 {med['ttft_p50_ms']:8.1f} ms ({med['ttft_p50_ms'] / base['ttft_p50_ms']:.2f})"
              f"  ITL p50 {med['itl_p50_ms']:7.2f} ms ({med['itl_p50_ms'] / base['itl_p50_ms']:.2f})"
              f"  {med['tok_s']:7.2f} tok/s ({med['tok_s'] / base['tok_s']:.2f});  the engine's own:"
              f" TTFT {srv['server_ttft_ms']:.1f} ms, per output token {srv['server_tpot_ms']:.2f} ms")
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
