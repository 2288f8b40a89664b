"""What host CPU beside the engine costs ``vllm serve`` on this machine: the exchange rate
between the serving path's own work and output tokens per second.

A diagnostic for the speed work. bench_peer.py prints, per side, the host CPU per output token
of everything outside vLLM's engine processes (tritonserver, the Python stubs, the HTTP front,
or ``vllm serve``'s API server); the tritonforge sides spend more of it than ``vllm serve``.
Whether that difference is what the throughput gap is made of is tested here without
tritonforge in the loop: ``vllm serve`` with the default spec's engine settings (bench_peer's
``vllm-spec`` side) is measured with and without a burner process beside it that takes a fixed
share of one core in short slices (``--burn-ms`` of busy loop every ``--period-ms``), in ABBA
order, ``--repeats`` times per level. The burner stands for extra serving-path work; its own
CPU is read from /proc and printed per output token, so the result reads as "X ms of extra host
CPU per output token cost Y of the throughput".

Printed: every run (tok/s, output tokens checked on every request by bench_peer's client,
TTFT p50, the 1-minute load average, the burner's ms per output token), then per level the
medians with and without the burner and their ratio.

    python benchmarks/bench_host_tax.py                          # c1, 1 ms every 11.6 ms, 3 repeats
    python benchmarks/bench_host_tax.py --levels 1 32 --burn-ms 0.5 --period-ms 11.6
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peer  # type: ignore[import-not-found]
from bench_gateway import MODEL_REF, REPO, engine_settings, process, vllm_flags, wait_http  # type: ignore[import-not-found]

_BURNER = """
import sys, time
busy, period = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
due = time.monotonic()
while True:
    end = time.monotonic() + busy
    while time.monotonic() < end:
        pass
    due += period
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    else:
        due = time.monotonic()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int, nargs="+", default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--burn-ms", type=float, default=1.0, help="busy loop per slice (ms)")
    p.add_argument("--period-ms", type=float, default=11.6, help="one slice every this many ms")
    p.add_argument("--per-stream", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--input-words", type=int, default=40)
    p.add_argument("--repository", type=Path, default=REPO)
    a = p.parse_args()

    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.preload import with_tcmalloc
    from tritonforge.runtime.server import find_install, free_port, server_environment

    engine_args, engine_env = engine_settings(a.repository)
    env = server_environment(find_install(), engine_env)
    env["LD_PRELOAD"] = with_tcmalloc(env.get("LD_PRELOAD", ""))  # as bench_peer's vllm-spec
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(resolve_model(MODEL_REF)),
            "--served-model-name", "peer", "--host", "127.0.0.1", "--port", str(port), *vllm_flags(engine_args)]
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "bench-host-tax-vllm.log"
    base = f"http://127.0.0.1:{port}"
    share = a.burn_ms / a.period_ms
    print(f"vllm serve {' '.join(vllm_flags(engine_args))}\nburner: {a.burn_ms} ms busy every "
          f"{a.period_ms} ms ({share:.1%} of one core), {os.cpu_count()} CPUs", flush=True)
    results: dict[tuple[int, bool], list[float]] = {}
    burn_per_tok: dict[int, list[float]] = {}
    with process(argv, env, log) as proc:
        wait_http(f"{base}/v1/models", 900, proc, log)
        asyncio.run(bench_peer.level("vllm-spec", base, "peer", bench_peer.prompts(4, a.input_words, seed=99),
                                     2, a.output_len))  # warm-up
        for rep in range(a.repeats):
            for burning in ((False, True) if rep % 2 == 0 else (True, False)):
                for c in a.levels:
                    texts = bench_peer.prompts(max(a.min_requests, c * a.per_stream), a.input_words, seed=c + rep)
                    burner = (subprocess.Popen([sys.executable, "-c", _BURNER, str(a.burn_ms), str(a.period_ms)])
                              if burning else None)
                    try:
                        time.sleep(0.2)
                        before = bench_peer.host_cpu_s([burner.pid]) if burner else 0.0
                        r = asyncio.run(bench_peer.level("vllm-spec", base, "peer", texts, c, a.output_len))
                        burnt = (bench_peer.host_cpu_s([burner.pid]) - before) if burner else 0.0
                    finally:
                        if burner is not None:
                            burner.kill()
                            burner.wait()
                    results.setdefault((c, burning), []).append(r.tok_s)
                    if burning:
                        burn_per_tok.setdefault(c, []).append(burnt / r.tokens * 1000)
                    print(f"burner {'on ' if burning else 'off'} c={c:<3} {r.tok_s:7.1f} tok/s  {r.tokens} tokens  "
                          f"TTFT p50 {r.ttft(0.5):5.0f} ms  load {r.load_1m:.2f}"
                          + (f"  burner {burnt / r.tokens * 1000:.3f} ms/tok" if burning else ""), flush=True)
    print("\nmedians of repeats (tok/s): without / with the burner, ratio, burner CPU per output token")
    for c in a.levels:
        off, on = statistics.median(results[(c, False)]), statistics.median(results[(c, True)])
        print(f"  c={c:<3} {off:7.1f} / {on:7.1f}  ratio {on / off:.3f}  burner "
              f"{statistics.median(burn_per_tok[c]):.3f} ms/tok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
