"""Where a running server's CPU goes while bench_peer's client loads it at one concurrency.

A diagnostic for the speed work (bench_peer.py gives the verdict; this says why): against a
server that is already up -- tritonforge's (Triton ``generate_stream``) or ``vllm serve``
(``/v1/completions``) -- it runs bench_peer's own client (same prompts, ``min_tokens =
max_tokens``, token counts checked) at ``--concurrency`` for ``--repeats`` waves and prints,
per wave:

* output tok/s and the client's TTFT p50;
* the CPU each process of the server's tree used (cores = CPU seconds from /proc / wall time),
  named by what it is (``VLLM::Worker``, ``VLLM::EngineCore``, ``tritonserver``, the Python
  backend stub of each model, vLLM's API server);
* how many sequences the engine was running on average (its own gauge, sampled every 0.1 s:
  ``tritonforge_engine_requests_running`` on Triton, ``vllm:num_requests_running`` on vLLM,
  which needs ``vllm serve`` without ``--disable-log-stats``);
* on Triton, per step of the ensemble: requests, queue and compute milliseconds (Triton's own
  ``nv_inference_*`` counters) and the engine's own mean TTFT.

    python benchmarks/where_cpu_goes.py --pid $(pgrep -f 'tritonforge serve') \\
        --url http://127.0.0.1:8000 --metrics http://127.0.0.1:8002/metrics --concurrency 32
    python benchmarks/where_cpu_goes.py --side vllm --pid <vllm serve pid> \\
        --url http://127.0.0.1:8300 --metrics http://127.0.0.1:8300/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peer  # type: ignore[import-not-found]
from tritonforge.runtime.procfs import descendants

_TICK = os.sysconf("SC_CLK_TCK")
_GAUGE = {"triton": "tritonforge_engine_requests_running", "vllm": "vllm:num_requests_running"}
_STEPS = ("preprocessing", "vllm_engine", "postprocessing")


def _name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    exe = argv[0].decode(errors="replace").rsplit("/", 1)[-1]
    if exe == "triton_python_backend_stub" and len(argv) > 1:
        return "stub " + argv[1].decode(errors="replace").split("/")[-3]  # <model>/1/model.py
    if "api_server" in " ".join(a.decode(errors="replace") for a in argv[:4]):
        return "vllm api server"
    return exe


def cpu_seconds(root: int) -> dict[int, tuple[str, float]]:
    out = {}
    for pid in [root, *descendants(root)]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (_name(pid), (int(stat[11]) + int(stat[12])) / _TICK)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return out


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines()
                                     if ln and not ln.startswith("#"))}


def _sum(m: dict[str, float], prefix: str, model: str | None = None) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix + "{")
               and (model is None or f'model="{model}"' in k))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=("triton", "vllm"), default="triton")
    p.add_argument("--pid", type=int, required=True, help="the server's root process")
    p.add_argument("--url", required=True, help="the server's HTTP base URL")
    p.add_argument("--metrics", required=True, help="the server's Prometheus URL")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output-len", type=int, default=64)
    a = p.parse_args()
    side = "triton" if a.side == "triton" else "vllm-spec"  # bench_peer's client: generate_stream or OpenAI

    def wave(n: int, seed: int, concurrency: int) -> bench_peer.Run:
        return asyncio.run(bench_peer.level(side, a.url, a.model, bench_peer.prompts(n, 40, seed=seed),
                                            concurrency, a.output_len))

    wave(8, 99, 4)  # warm-up
    running: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            running.append(_sum(metrics(a.metrics), _GAUGE[a.side]))
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    for rep in range(a.repeats):
        cpu0, m0, t0 = cpu_seconds(a.pid), metrics(a.metrics), time.monotonic()
        running.clear()
        run = wave(3 * a.concurrency, a.concurrency + rep, a.concurrency)
        wall = time.monotonic() - t0
        cpu1, m1 = cpu_seconds(a.pid), metrics(a.metrics)
        print(f"\nc={a.concurrency} wave {rep + 1}: {run.tok_s:.1f} tok/s, {run.tokens} tokens, TTFT p50 "
              f"{run.ttft(0.5):.0f} ms; engine running {statistics.mean(running):.1f} on average "
              f"(of {a.concurrency}); load average {os.getloadavg()[0]:.2f}")
        used: dict[str, float] = {}
        for pid, (name, secs) in cpu1.items():
            used[name] = used.get(name, 0.0) + secs - cpu0.get(pid, (name, 0.0))[1]
        for name, secs in sorted(used.items(), key=lambda kv: -kv[1]):
            if secs / wall >= 0.005:
                print(f"  {name:28s} {secs / wall:5.2f} cores")
        print(f"  {'(all of the server)':28s} {sum(used.values()) / wall:5.2f} cores "
              f"of {os.cpu_count()}; per output token {1000 * sum(used.values()) / run.tokens:.2f} ms CPU")
        if a.side == "triton":
            n = _sum(m1, "tritonforge_engine_time_to_first_token_seconds_count") - \
                _sum(m0, "tritonforge_engine_time_to_first_token_seconds_count")
            s = _sum(m1, "tritonforge_engine_time_to_first_token_seconds_sum") - \
                _sum(m0, "tritonforge_engine_time_to_first_token_seconds_sum")
            print(f"  engine's own TTFT (arrival in the engine model -> first token): mean {1000 * s / max(n, 1):.0f} ms")
            for step in _STEPS:
                d = {k: _sum(m1, "nv_inference_" + k, step) - _sum(m0, "nv_inference_" + k, step)
                     for k in ("request_success", "queue_duration_us", "compute_infer_duration_us")}
                c = max(d["request_success"], 1)
                print(f"  {step:15s} {d['request_success']:6.0f} requests: queue {d['queue_duration_us'] / c / 1000:6.2f} ms,"
                      f" compute {d['compute_infer_duration_us'] / c / 1000:6.2f} ms each")
    stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
