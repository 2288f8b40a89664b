"""Output tokens/s and TTFT through Triton vs the bare engine in-process, side by side.

    .venv/bin/python benchmarks/bench_engine.py [--requests 32] [--max-tokens 64]

1. Starts the real bundled tritonserver on the default repository (model_repository/) and
   streams the workload through the ensemble with the typed async gRPC client at each
   concurrency, then stops it.
2. Runs the SAME engine (tritonforge's EngineRunner over its vLLM adapter, same engine arguments read from the
   repository's vllm_engine config, same token ids) in this process, without Triton.
3. Prints tok/s per concurrency for both, c16/c1 through Triton, Triton/bare per concurrency,
   and the TTFT p50 overhead.

Every request generates exactly --max-tokens tokens (min_tokens = max_tokens), so both sides
do the same work. The two are run one after the other (a 2-core machine cannot host both
fairly at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "model_repository"
PROMPT = "Write a short story about a lighthouse keeper number {i} who finds a message in a bottle."


def _param(cfg_text: str, key: str) -> str:
    m = re.search(rf'key:\s*"{key}"\s*value\s*\{{\s*string_value:\s*"((?:[^"\\]|\\.)*)"', cfg_text)
    if not m:
        raise SystemExit(f"parameter {key} not found")
    return json.loads(f'"{m.group(1)}"')


async def _triton_round(grpc_url: str, model: str, concurrency: int, n: int, max_tokens: int) -> tuple[float, list[float], int]:
    from tritonforge.clients import AsyncClient

    sem = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    tokens = 0

    async def one(client: AsyncClient, i: int) -> None:
        nonlocal tokens
        async with sem:
            c = await client.complete(PROMPT.format(i=i), max_tokens=max_tokens,
                                      min_tokens=max_tokens, stream=True)
            tokens += c.completion_tokens
            if c.ttft is not None:
                ttfts.append(c.ttft)

    async with AsyncClient(grpc_url, model=model) as client:
        await client.complete("warm up", max_tokens=4)
        start = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(n)))
        wall = time.perf_counter() - start
    return tokens / wall, ttfts, tokens


class _Collect:
    def __init__(self) -> None:
        self.first: float | None = None
        self.tokens = 0
        self.done = threading.Event()

    def send(self, outputs, final):  # type: ignore[no-untyped-def]
        n = int(outputs["sequence_length"].reshape(-1)[0])
        if n and self.first is None:
            self.first = time.perf_counter()
        self.tokens += n
        if final:
            self.done.set()

    def send_error(self, kind, message, param=None):  # type: ignore[no-untyped-def]
        print("error:", message, file=sys.stderr)
        self.done.set()

    def is_cancelled(self) -> bool:
        return False


def _bare_round(runner, ids_list, concurrency: int, max_tokens: int) -> tuple[float, list[float], int]:  # type: ignore[no-untyped-def]
    from tritonforge.triton_models.engine import EngineRequest

    sem = threading.Semaphore(concurrency)
    ttfts: list[float] = []
    total = 0
    lock = threading.Lock()

    def one(ids: list[int]) -> None:
        nonlocal total
        with sem:
            c = _Collect()
            sent = time.perf_counter()
            runner.submit(EngineRequest(input_ids=ids, max_tokens=max_tokens, streaming=True, end_id=2,
                                        sampling={"min_tokens": max_tokens, "temperature": 0.0}), c)
            c.done.wait()
            with lock:
                total += c.tokens
                if c.first is not None:
                    ttfts.append(c.first - sent)

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(ids,)) for ids in ids_list]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return total / wall, ttfts, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,16")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    cfg = (REPO / "vllm_engine" / "config.pbtxt").read_text()
    ref = _param(cfg, "tritonforge_model")
    engine_args = json.loads(_param(cfg, "tritonforge_engine_args"))
    engine_env = json.loads(_param(cfg, "tritonforge_engine_env"))
    model = next(p.parent.name for p in REPO.glob("*/config.pbtxt") if 'platform: "ensemble"' in p.read_text())
    folder = resolve_model(ref)

    results: dict[str, dict[int, tuple[float, float]]] = {"triton": {}, "bare": {}}
    opts = ServerOptions(REPO, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    server = TritonServer(opts)
    print(f"starting tritonserver on {opts.grpc_url} ...", flush=True)
    server.start()
    try:
        server.wait_ready(900)
        for c in levels:
            tps, ttfts, toks = asyncio.run(_triton_round(opts.grpc_url, model, c, args.requests, args.max_tokens))
            results["triton"][c] = (tps, statistics.median(ttfts))
            print(f"triton c={c:>2}: {tps:7.1f} tok/s  TTFT p50 {statistics.median(ttfts) * 1000:7.1f} ms  ({toks} tokens)", flush=True)
    finally:
        server.stop()

    import os

    os.environ.update(engine_env)
    # The same vLLM environment the server's Python backend gets (thread placement, caches).
    from tritonforge.runtime.server import find_install, server_environment

    served = server_environment(find_install())
    for key, value in served.items():
        if key.startswith("VLLM_"):
            os.environ[key] = value
    from transformers import AutoTokenizer
    from tritonforge.triton_models.engine import EngineRunner
    from tritonforge.triton_models.engine.vllm import VllmAdapter

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids_list = [tok.encode(PROMPT.format(i=i), add_special_tokens=True) for i in range(args.requests)]
    runner = EngineRunner(VllmAdapter(str(folder), engine_args))
    print("starting the bare engine in-process ...", flush=True)
    runner.start()
    try:
        _bare_round(runner, ids_list[:1], 1, 4)  # warm up
        for c in levels:
            tps, ttfts, toks = _bare_round(runner, ids_list, c, args.max_tokens)
            results["bare"][c] = (tps, statistics.median(ttfts))
            print(f"bare   c={c:>2}: {tps:7.1f} tok/s  TTFT p50 {statistics.median(ttfts) * 1000:7.1f} ms  ({toks} tokens)", flush=True)
    finally:
        runner.shutdown()

    print("\nsummary (same workload, same engine arguments, one run)")
    print(f"{'conc':>4} {'triton tok/s':>13} {'bare tok/s':>11} {'triton/bare':>12} {'TTFT overhead ms':>17}")
    for c in levels:
        t, b = results["triton"][c], results["bare"][c]
        print(f"{c:>4} {t[0]:>13.1f} {b[0]:>11.1f} {t[0] / b[0]:>12.3f} {(t[1] - b[1]) * 1000:>17.1f}")
    lo, hi = min(levels), max(levels)
    print(f"scaling through Triton c{hi}/c{lo}: {results['triton'][hi][0] / results['triton'][lo][0]:.2f}x "
          f"(bare engine: {results['bare'][hi][0] / results['bare'][lo][0]:.2f}x)")


if __name__ == "__main__":
    main()
