"""Locust load test vs the typed AsyncClient, and the chunks/s one Locust process sustains.

Part 1 -- TTFT fidelity. The same closed-loop workload (U users, each sending the next
request as soon as the last one ends, prompts from one dataset, the same max_tokens, for D
seconds) runs through Locust's gRPC user (a subprocess) and through the typed
``AsyncClient`` (U asyncio tasks). Prints both TTFT medians and their ratio
(goal: within 10 %). Runs alternate (Locust, async, async, Locust, ...) to even out the
drift of a shared machine; the medians of all runs of each side are compared.

Part 2 -- Locust throughput. A trivial decoupled Python model speaking the ensemble's
tensor contract (it streams N one-token chunks immediately: no engine) is generated into a
temporary repository and served by the real tritonserver
(``tritonforge.runtime.server.TritonServer``); one Locust process (gRPC streaming, then
HTTP SSE) loads it and the chunks/s it sustains are printed (goal >= 2,000), with the
Locust process's CPU use (near 100 % of a core means Locust is the limit).

    python benchmarks/bench_loadtest.py                       # server from $TRITONFORGE_TEST_SERVER
    python benchmarks/bench_loadtest.py --grpc-url 127.0.0.1:8001 --model smollm2
    python benchmarks/bench_loadtest.py --skip-ttft            # part 2 only (no LLM server)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tritonforge.loadtests as loadtests_pkg
from tritonforge import contract
from tritonforge.clients import AsyncClient, Request, TritonForgeError
from tritonforge.loadtests.datasets import PromptPool, cached_prompts
from tritonforge.loadtests.tokens import DEFAULT_TOKENIZER

LOCUSTFILE = Path(loadtests_pkg.__file__).resolve().parent / "locustfile.py"
FAST_MODEL = "fast_stream"
FAST_TEXT = " the"  # one token for SmolLM2's tokenizer, so chunks == counted tokens


# -- running Locust ------------------------------------------------------------------------
def run_locust(*, protocol: str, grpc_url: str, http_url: str, model: str, users: int,
               duration: int, max_tokens: int, dataset: str, out: Path) -> tuple[dict[str, Any], float, float]:
    """One headless local Locust run; (summary, wall seconds, Locust CPU seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-u", str(users), "-r", str(users), "-t", f"{duration}s", "--stop-timeout", "30",
           "--protocol", protocol, "--model", model, "--triton-grpc", grpc_url,
           "--triton-http", http_url, "--max-tokens", str(max_tokens), "--dataset", dataset,
           "--prometheus-port", "-1", "--results-dir", str(out), "--loglevel", "WARNING"]
    env = dict(os.environ, MPLBACKEND="Agg")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                         timeout=duration + 120)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode not in (0, 1):
        sys.exit(f"locust failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text()), wall, cpu


# -- the same workload through the typed AsyncClient ----------------------------------------
async def run_async(*, grpc_url: str, model: str, users: int, duration: int, max_tokens: int,
                    dataset: str) -> list[float]:
    prompts = cached_prompts(dataset, DEFAULT_TOKENIZER, max_tokens=max_tokens)
    ttfts: list[float] = []
    deadline = time.monotonic() + duration
    async with AsyncClient(grpc_url, model=model, timeout=300) as client:
        async def user(i: int) -> None:
            pool = PromptPool(prompts, seed=i)
            while time.monotonic() < deadline:
                p = pool.next()
                req = Request(prompt=p.prompt, messages=p.messages, max_tokens=p.max_tokens)
                try:
                    async with client.stream(req) as s:
                        async for _ in s:
                            pass
                        c = s.completion
                except TritonForgeError:
                    continue
                if c.ttft is not None and c.text:
                    ttfts.append(c.ttft * 1000.0)

        await asyncio.gather(*(user(i) for i in range(users)))
    return ttfts


def part_ttft(args: argparse.Namespace) -> None:
    print(f"== TTFT: Locust gRPC user vs typed AsyncClient ({args.users} users, {args.duration} s,"
          f" max_tokens {args.max_tokens}, dataset {args.dataset}, model {args.model} at {args.grpc_url})")
    locust_runs: list[float] = []
    async_runs: list[float] = []
    # Warm-up, not measured: a freshly started server's first requests are slower, and the
    # first side to run would pay for it.
    warm = asyncio.run(run_async(grpc_url=args.grpc_url, model=args.model, users=args.users,
                                 duration=args.warmup, max_tokens=args.max_tokens,
                                 dataset=args.dataset))
    print(f"  warm-up ({args.warmup} s, not counted): {len(warm)} requests")
    with tempfile.TemporaryDirectory() as tmp:
        # ABBA order: locust, async, async, locust, ...
        order = [side for r in range(args.rounds)
                 for side in (("locust", "async") if r % 2 == 0 else ("async", "locust"))]
        for k, side in enumerate(order):
            if side == "locust":
                summary, _, _ = run_locust(protocol="grpc", grpc_url=args.grpc_url,
                                           http_url=args.http_url, model=args.model,
                                           users=args.users, duration=args.duration,
                                           max_tokens=args.max_tokens, dataset=args.dataset,
                                           out=Path(tmp) / f"run{k}")
                st = summary["time_to_first_token_ms"]
                if st:
                    locust_runs.append(st["p50"])
                print(f"  locust run: TTFT p50 {st['p50'] if st else float('nan'):.1f} ms over"
                      f" {summary['requests']['succeeded']} requests (load average {os.getloadavg()[0]:.2f})")
            else:
                ttfts = asyncio.run(run_async(grpc_url=args.grpc_url, model=args.model,
                                              users=args.users, duration=args.duration,
                                              max_tokens=args.max_tokens, dataset=args.dataset))
                if ttfts:
                    async_runs.append(statistics.median(ttfts))
                print(f"  async run:  TTFT p50 {statistics.median(ttfts) if ttfts else float('nan'):.1f} ms"
                      f" over {len(ttfts)} requests (load average {os.getloadavg()[0]:.2f})")
    if not locust_runs or not async_runs:
        print("  no successful requests on one side; no ratio")
        return
    lm, am = statistics.median(locust_runs), statistics.median(async_runs)
    ratio = lm / am
    verdict = "within" if abs(ratio - 1) <= 0.10 else "OUTSIDE"
    print(f"  TTFT median: Locust {lm:.1f} ms, AsyncClient {am:.1f} ms, ratio {ratio:.3f}"
          f" ({verdict} the 10 % goal)")


# -- a fast streaming model ----------------------------------------------------------------
_MODEL_PY = '''\
"""Streams max_tokens one-token chunks immediately (load-generator benchmark model)."""
import numpy as np
import triton_python_backend_utils as pb_utils

TEXT = np.array([[{text!r}.encode()]], dtype=object)
NONE = np.array([[b""]], dtype=object)
LENGTH = np.array([[b"length"]], dtype=object)
ONE = np.array([[1]], dtype=np.int32)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            mt = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            n = int(mt.as_numpy().reshape(-1)[0]) if mt is not None else 16
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", TEXT),
                    pb_utils.Tensor("finish_reason", LENGTH if i == n - 1 else NONE),
                    pb_utils.Tensor("num_input_tokens", ONE),
                    pb_utils.Tensor("num_output_tokens", ONE),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def tensor_block(kind: str, tensors: tuple[contract.Tensor, ...]) -> str:
    """A config.pbtxt ``input [...]`` or ``output [...]`` block of ``tensors`` (``kind``)."""
    rows = []
    for t in tensors:
        opt = "\n    optional: true" if (kind == "input" and t.optional) else ""
        dims = ", ".join(str(d) for d in t.dims)
        rows.append(f'  {{\n    name: "{t.name}"\n    data_type: {t.dtype.value}\n'
                    f"    dims: [ {dims} ]{opt}\n  }}")
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def write_fast_repository(root: Path, instances: int) -> None:
    folder = root / FAST_MODEL / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(_MODEL_PY.format(text=FAST_TEXT))
    (root / FAST_MODEL / "config.pbtxt").write_text(
        f'name: "{FAST_MODEL}"\nbackend: "python"\nmax_batch_size: 8\n'
        "model_transaction_policy { decoupled: true }\n"
        + tensor_block("input", contract.ENSEMBLE_INPUTS)
        + tensor_block("output", contract.ENSEMBLE_OUTPUTS)
        + f"instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n"
    )


async def async_chunk_rate(url: str, protocol: str, *, users: int, duration: int,
                           max_tokens: int) -> float:
    """Chunks/s the typed AsyncClient reads from the fast model (closed loop, ``users`` tasks)."""
    chunks = 0
    deadline = time.monotonic() + duration
    async with AsyncClient(url, protocol=protocol, model=FAST_MODEL, timeout=60) as client:  # type: ignore[arg-type]
        async def user() -> None:
            nonlocal chunks
            while time.monotonic() < deadline:
                async with client.stream("hi", max_tokens=max_tokens) as s:
                    async for _ in s:
                        chunks += 1

        t0 = time.monotonic()
        await asyncio.gather(*(user() for _ in range(users)))
        return chunks / (time.monotonic() - t0)


def part_chunks(args: argparse.Namespace) -> None:
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    print(f"== chunks/s one Locust process sustains: a fast streaming Python model"
          f" ({FAST_MODEL}: {args.fast_tokens} immediate one-token chunks per request, no engine;"
          " the CPU engine cannot stream 2,000 chunks/s here), served by the real tritonserver")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        write_fast_repository(repo, args.fast_instances)
        opts = ServerOptions(repository=repo, http_port=free_port(), grpc_port=free_port(),
                             metrics_port=free_port(), restrict_admin=False,
                             log_file=Path(tmp) / "server.log")
        with TritonServer(opts) as server:
            server.wait_ready(timeout=120)
            for protocol in args.fast_protocols:
                summary, wall, cpu = run_locust(
                    protocol=protocol, grpc_url=opts.grpc_url, http_url=opts.http_url,
                    model=FAST_MODEL, users=args.fast_users, duration=args.fast_duration,
                    max_tokens=args.fast_tokens, dataset="short-chat", out=Path(tmp) / protocol)
                req = summary["requests"]
                rate = summary["output_token_throughput_per_s"]
                per_req = summary["output_tokens_total"] / max(1, req["succeeded"])
                verdict = "meets" if rate >= 2000 else "BELOW"
                ref = asyncio.run(async_chunk_rate(
                    opts.grpc_url if protocol == "grpc" else opts.http_url, protocol,
                    users=args.fast_users, duration=args.fast_duration, max_tokens=args.fast_tokens))
                print(f"  {protocol:4s}: {rate:8.0f} chunks/s ({verdict} the 2,000 goal),"
                      f" {req['succeeded']} ok / {req['failed']} failed requests,"
                      f" {per_req:.1f} chunks per request, TTFT p50"
                      f" {summary['time_to_first_token_ms']['p50']:.2f} ms;"
                      f" Locust process CPU {cpu:.1f} s over {wall:.1f} s wall"
                      f" ({100 * cpu / wall:.0f} % of one core, start-up included)")
                print(f"        the typed AsyncClient on the same server and workload: {ref:8.0f}"
                      f" chunks/s (the server's ceiling seen by a non-Locust client);"
                      f" Locust/AsyncClient {rate / ref:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env = dict(p.split("=", 1) for p in os.environ.get("TRITONFORGE_TEST_SERVER", "").split(",") if "=" in p)
    ap.add_argument("--grpc-url", default=env.get("grpc", "127.0.0.1:8001"))
    ap.add_argument("--http-url", default=env.get("http", "127.0.0.1:8000"))
    ap.add_argument("--model", default=env.get("model", "smollm2"))
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--duration", type=int, default=20, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each side")
    ap.add_argument("--warmup", type=int, default=8, help="seconds of unmeasured requests first")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dataset", default="short-chat")
    ap.add_argument("--fast-users", type=int, default=16)
    ap.add_argument("--fast-tokens", type=int, default=64)
    ap.add_argument("--fast-duration", type=int, default=15)
    ap.add_argument("--fast-instances", type=int, default=2)
    ap.add_argument("--fast-protocols", nargs="+", default=["grpc", "http"])
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-chunks", action="store_true")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if not args.skip_ttft:
        part_ttft(args)
    if not args.skip_chunks:
        part_chunks(args)


if __name__ == "__main__":
    main()
