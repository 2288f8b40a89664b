"""Output tokens/s and TTFT through Triton vs the same engine bare, side by side, in ABBA order.

    .venv/bin/python benchmarks/bench_engine.py [--levels 1 8 16 32] [--repeats 3] [--requests 32]
                                                [--max-tokens 64] [--input-words 40] [--json PATH]

Sides (one at a time, never both):

* ``triton`` -- the real bundled tritonserver on the default repository (``model_repository/``),
  the workload streamed through its ensemble with tritonforge's typed async gRPC client;
* ``bare``   -- the SAME engine without Triton: tritonforge's ``EngineRunner`` over its vLLM
  adapter with the engine arguments, engine environment and stream coalescing settings of the
  repository's ``vllm_engine`` config, and the CPU allocator preload that engine model applies
  (``runtime.preload.with_tcmalloc`` put in ``LD_PRELOAD`` before the engine is created, so
  vLLM's engine-core process loads tcmalloc), fed the token ids the preprocessing would make,
  by threads in the engine's own process. That process is a child of this script (in its own
  process group, the server's environment), so every visit starts clean and leaves nothing
  running.

Each repeat visits both sides -- start the server (or engine), warm up, run every level, stop
it -- forward, then reversed: triton bare, bare triton, triton bare ... (ABBA), so a drift of
the machine during the run falls on both sides alike.

Every level sends the same ``--requests`` distinct prompts (bench_peer's, no shared prefix) to
both sides at that concurrency, greedy, ``min_tokens = max_tokens = --max-tokens``. Checked: every
request generated exactly ``--max-tokens`` tokens and each side exactly requests x max_tokens per
level; otherwise the run stops. Output tok/s = output tokens / the level's wall time; TTFT =
request sent -> first response carrying tokens. The 1-minute load average is recorded after
every measurement.

Printed: per level and side, the median over repeats (min-max) of output tok/s and TTFT p50;
Triton/bare for both (median of the per-repeat ratios, min-max); the c16/c1 scaling (else the
highest/lowest level) of each side; seconds to ready per visit; which engine processes have
tcmalloc mapped. ``--json PATH`` writes every raw figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import REPO, engine_settings, ensemble_name, process  # type: ignore[import-not-found]
from bench_peer import Run, prompts  # type: ignore[import-not-found]
from tritonforge.runtime.procfs import descendants

SIDES = ("triton", "bare")
WARM_SEED = 99  # warm-up prompts: a seed no level uses (levels use their concurrency)


def _engine_parameters() -> dict[str, str]:
    """The engine model's string parameters, from its config parsed into Triton's ModelConfig."""
    from google.protobuf import text_format  # type: ignore[import-untyped]
    from tritonclient.grpc import model_config_pb2 as mc  # type: ignore[import-untyped]
    from tritonforge.contract import MODEL_VLLM_ENGINE

    cfg = text_format.Parse((REPO / MODEL_VLLM_ENGINE / "config.pbtxt").read_text(), mc.ModelConfig())
    return {k: v.string_value for k, v in cfg.parameters.items()}


def _check(side: str, concurrency: int, counts: list[int], requests: int, max_tokens: int) -> None:
    """Both sides must do the same work: requests x max_tokens output tokens, max_tokens each."""
    wrong = sorted({n for n in counts if n != max_tokens})
    if len(counts) != requests or sum(counts) != requests * max_tokens or wrong:
        raise SystemExit(
            f"{side} c={concurrency}: {len(counts)} requests answered with {sum(counts)} output tokens,"
            f" expected {requests} x {max_tokens} = {requests * max_tokens}"
            + (f" (requests generated {wrong} tokens)" if wrong else "")
            + ": the sides would not do the same work; stopping")


def _line(side: str, r: Run) -> str:
    return (f"  {side:>6} c={r.concurrency:<3} {r.tok_s:8.1f} tok/s  TTFT p50 {r.ttft(0.5):7.0f} ms"
            f"  ({r.tokens} tokens, {r.wall_s:.1f} s)  load {r.load_1m:.2f}")


def _tcmalloc_in(pids: list[int]) -> dict[str, bool]:
    """``name[pid]`` -> whether tcmalloc is mapped into that process."""
    out: dict[str, bool] = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out[f"{name}[{pid}]"] = "tcmalloc" in maps
    return out


# -- the triton side -------------------------------------------------------------------------
async def _triton_level(client: Any, texts: list[str], concurrency: int,
                        max_tokens: int) -> tuple[Run, list[int]]:
    todo = list(texts)
    ttfts: list[float] = []
    counts: list[int] = []

    async def worker() -> None:
        while todo:
            c = await client.complete(todo.pop(), max_tokens=max_tokens, min_tokens=max_tokens,
                                      temperature=0.0, stream=True)
            if c.ttft is None:
                raise SystemExit(f"triton c={concurrency}: a request streamed no tokens")
            counts.append(int(c.completion_tokens))
            ttfts.append(c.ttft * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    run = Run("triton", concurrency, len(texts), wall, sum(counts), ttfts, os.getloadavg()[0])
    return run, counts


async def _triton_levels(grpc_url: str, model: str, warm: list[str], texts: dict[int, list[str]],
                         levels: list[int], max_tokens: int) -> list[tuple[Run, list[int]]]:
    from tritonforge.clients import AsyncClient

    out: list[tuple[Run, list[int]]] = []
    async with AsyncClient(grpc_url, model=model, timeout=1800) as client:
        await _triton_level(client, warm, 2, max_tokens)  # warm-up, not measured
        for c in levels:
            run, counts = await _triton_level(client, texts[c], c, max_tokens)
            print(_line("triton", run), flush=True)
            out.append((run, counts))
    return out


def triton_visit(model: str, warm: list[str], texts: dict[int, list[str]], levels: list[int],
                 max_tokens: int, logs: Path) -> tuple[list[tuple[Run, list[int]]], float, dict[str, bool]]:
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    opts = ServerOptions(REPO, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                         log_file=logs / "bench-engine-triton.log")
    server = TritonServer(opts)
    print(f"starting tritonserver on {opts.grpc_url} (the default repository) ...", flush=True)
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready(900)
        ready = time.monotonic() - t0
        proc = server.process
        preloaded = _tcmalloc_in(descendants(proc.pid)) if proc is not None else {}
        results = asyncio.run(_triton_levels(opts.grpc_url, model, warm, texts, levels, max_tokens))
    finally:
        server.stop()
    return results, ready, preloaded


# -- the bare side ---------------------------------------------------------------------------
class _Collect:
    """A Responder that counts the streamed tokens and notes when the first arrived."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.tokens = 0
        self.error: str | None = None
        self.done = threading.Event()

    def send(self, outputs: dict[str, np.ndarray[Any, Any]], final: bool) -> None:
        n = int(outputs["sequence_length"].reshape(-1)[0])
        if n and self.first is None:
            self.first = time.perf_counter()
        self.tokens += n
        if final:
            self.done.set()

    def send_error(self, kind: Any, message: str, param: str | None = None) -> None:
        self.error = f"{kind}: {message}"
        self.done.set()

    def is_cancelled(self) -> bool:
        return False


def _bare_level(runner: Any, ids_list: list[list[int]], concurrency: int, max_tokens: int,
                end_id: int | None) -> dict[str, Any]:
    from tritonforge.triton_models.engine import EngineRequest

    todo: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    for ids in reversed(ids_list):  # the order the triton side pops its prompts in
        todo.put(ids)
    ttfts: list[float] = []
    counts: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                ids = todo.get_nowait()
            except queue.Empty:
                return
            c = _Collect()
            sent = time.perf_counter()
            runner.submit(EngineRequest(input_ids=ids, max_tokens=max_tokens, streaming=True,
                                        end_id=end_id,
                                        sampling={"min_tokens": max_tokens, "temperature": 0.0}), c)
            c.done.wait()
            with lock:
                counts.append(c.tokens)
                if c.error is not None:
                    errors.append(c.error)
                if c.first is not None:
                    ttfts.append((c.first - sent) * 1000)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "requests": len(ids_list), "wall_s": wall, "tokens": sum(counts),
            "ttft_ms": ttfts, "load_1m": os.getloadavg()[0], "counts": counts, "errors": errors}


def bare_worker(spec_path: Path) -> int:
    """The bare side's process: the engine in-process, as the engine model creates it."""
    spec = json.loads(spec_path.read_text())
    # What tritonforge's engine model does before it creates a vLLM engine on a CPU.
    if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
        from tritonforge.runtime.preload import with_tcmalloc

        os.environ["LD_PRELOAD"] = with_tcmalloc(os.environ.get("LD_PRELOAD", ""))
    print(f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}", flush=True)
    from transformers import AutoTokenizer
    from tritonforge.triton_models.engine import EngineRunner
    from tritonforge.triton_models.engine.vllm import VllmAdapter

    tok = AutoTokenizer.from_pretrained(spec["folder"])
    end_id = tok.eos_token_id

    def encode(texts: list[str]) -> list[list[int]]:  # as preprocessing encodes text_input
        return [list(tok.encode(t, add_special_tokens=True)) for t in texts]

    runner = EngineRunner(VllmAdapter(spec["folder"], spec["engine_args"]),
                          stream_interval_s=spec["stream_interval_s"], coalesce_from=spec["coalesce_from"])
    t0 = time.monotonic()
    runner.start()
    try:
        ready = time.monotonic() - t0
        preloaded = _tcmalloc_in(descendants(os.getpid()))
        warm = _bare_level(runner, encode(spec["warm"]), 2, spec["max_tokens"], end_id)
        if warm["errors"]:
            raise SystemExit(f"bare warm-up: {warm['errors'][0]}")
        runs = []
        for c in spec["levels"]:
            r = _bare_level(runner, encode(spec["texts"][str(c)]), c, spec["max_tokens"], end_id)
            print(f"bare c={c}: {r['tokens']} tokens in {r['wall_s']:.1f} s", flush=True)
            runs.append(r)
    finally:
        runner.shutdown()
    Path(spec["out"]).write_text(json.dumps({"ready_s": ready, "tcmalloc": preloaded, "runs": runs}))
    return 0


def bare_visit(spec: dict[str, Any], engine_env: dict[str, str],
               logs: Path) -> tuple[list[tuple[Run, list[int]]], float, dict[str, bool]]:
    from tritonforge.runtime.server import find_install, server_environment

    log = logs / "bench-engine-bare.log"
    env = server_environment(find_install(), engine_env)  # the Python backend's environment
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps({**spec, "out": str(out)}))
        print(f"starting the bare engine (EngineRunner + vLLM, in-process; log {log}) ...", flush=True)
        with process([sys.executable, str(Path(__file__).resolve()), "--bare-worker", str(spec_path)],
                     env, log) as proc:
            rc = proc.wait()
            with contextlib.suppress(ProcessLookupError):  # whatever it left in its group
                os.killpg(proc.pid, signal.SIGKILL)
        if rc != 0 or not out.is_file():
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"the bare engine process exited with {rc}\n{tail}")
        result = json.loads(out.read_text())
    runs: list[tuple[Run, list[int]]] = []
    for r in result["runs"]:
        if r["errors"]:
            raise SystemExit(f"bare c={r['concurrency']}: {len(r['errors'])} requests failed: {r['errors'][0]}")
        run = Run("bare", r["concurrency"], r["requests"], r["wall_s"], r["tokens"], r["ttft_ms"], r["load_1m"])
        print(_line("bare", run), flush=True)
        runs.append((run, r["counts"]))
    return runs, float(result["ready_s"]), {str(k): bool(v) for k, v in result["tcmalloc"].items()}


# -- report ----------------------------------------------------------------------------------
def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _fmt(s: dict[str, float], spec: str = ".1f") -> str:
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def report(runs: list[tuple[int, Run]], levels: list[int], args: argparse.Namespace) -> dict[str, Any]:
    def of(side: str, c: int) -> dict[int, Run]:
        return {rep: r for rep, r in runs if r.side == side and r.concurrency == c}

    table: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in SIDES}
    ratios: dict[int, dict[str, dict[str, float]]] = {}
    for c in levels:
        for s in SIDES:
            rs = list(of(s, c).values())
            table[s][c] = {"tok_s": _spread([r.tok_s for r in rs]),
                           "ttft_p50_ms": _spread([r.ttft(0.5) for r in rs]),
                           "load_1m": _spread([r.load_1m for r in rs]), "repeats": len(rs)}
        tri, bare = of("triton", c), of("bare", c)
        ratios[c] = {"tok_s": _spread([tri[k].tok_s / bare[k].tok_s for k in tri]),
                     "ttft_p50": _spread([tri[k].ttft(0.5) / bare[k].ttft(0.5) for k in tri])}
    lo, hi = (1, 16) if {1, 16} <= set(levels) else (min(levels), max(levels))
    scaling = {s: _spread([of(s, hi)[k].tok_s / of(s, lo)[k].tok_s for k in of(s, hi)]) for s in SIDES}

    print(f"\n{args.max_tokens} output tokens per request (checked: requests x max_tokens per level on "
          f"both sides), greedy, {args.requests} requests per level, {args.input_words}-word prompts; "
          f"{args.repeats} repeats in ABBA order; median over repeats (min-max); {os.cpu_count()} CPUs")
    print(f"{'side':>6} {'conc':>4} | {'output tok/s (min-max)':>24} | {'TTFT p50 ms (min-max)':>24} "
          f"| {'load 1m':>7}")
    for c in levels:
        for s in SIDES:
            t = table[s][c]
            print(f"{s:>6} {c:>4} | {_fmt(t['tok_s']):>24} | {_fmt(t['ttft_p50_ms'], '.0f'):>24} "
                  f"| {t['load_1m']['median']:7.2f}")
    print("\nTriton/bare, median of per-repeat ratios (min-max); tok/s: higher is better, "
          "TTFT p50: lower is better")
    for c in levels:
        print(f"  c={c:<3} tok/s {_fmt(ratios[c]['tok_s'], '.3f')}   "
              f"TTFT p50 {_fmt(ratios[c]['ttft_p50'], '.2f')}")
    print(f"\nscaling c{hi}/c{lo} (tok/s, median of per-repeat ratios, min-max): "
          + "   ".join(f"{s} {_fmt(scaling[s], '.2f')}" for s in SIDES))
    return {"summary": table, "ratios_triton_over_bare": ratios,
            "scaling": {"levels": [hi, lo], **scaling}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", nargs="+", type=int, default=[1, 8, 16, 32], help="concurrency levels")
    p.add_argument("--repeats", type=int, default=3, help="visits per side (ABBA order); >= 3 for a median")
    p.add_argument("--requests", type=int, default=32, help="requests per level (>= the highest level)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens of every request (min = max)")
    p.add_argument("--input-words", type=int, default=40, help="words per prompt")
    p.add_argument("--json", type=Path, help="write every raw figure here")
    p.add_argument("--bare-worker", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.bare_worker is not None:
        return bare_worker(a.bare_worker)
    levels = list(dict.fromkeys(a.levels))
    if a.repeats < 1 or a.max_tokens < 1 or min(levels) < 1:
        p.error("--repeats, --max-tokens and every level must be >= 1")
    if a.requests < max(levels):
        p.error(f"--requests ({a.requests}) is below the highest level ({max(levels)}): "
                "that level would never reach its concurrency")

    from tritonforge.contract import MODEL_VLLM_ENGINE, Param
    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir

    params = _engine_parameters()
    engine_args, engine_env = engine_settings(REPO)  # what the engine model reads
    engine_args.pop("model", None)
    stream_interval_s = int(params.get(Param.STREAM_INTERVAL_MS.value) or 0) / 1000
    coalesce_from = int(params.get(Param.COALESCE_FROM.value) or 1)
    folder = resolve_model(params[Param.MODEL.value])
    model = ensemble_name(REPO)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    warm = prompts(4, a.input_words, seed=WARM_SEED)
    texts = {c: prompts(a.requests, a.input_words, seed=c) for c in levels}
    spec = {"folder": str(folder), "engine_args": engine_args, "stream_interval_s": stream_interval_s,
            "coalesce_from": coalesce_from, "warm": warm, "texts": {str(c): t for c, t in texts.items()},
            "levels": levels, "max_tokens": a.max_tokens}
    print(f"engine arguments (the repository's {MODEL_VLLM_ENGINE} config): {json.dumps(engine_args)}\n"
          f"engine environment: {json.dumps(engine_env)}; stream coalescing: every "
          f"{stream_interval_s * 1000:.0f} ms from {coalesce_from} live streams", flush=True)

    runs: list[tuple[int, Run]] = []
    ready: dict[str, list[float]] = {s: [] for s in SIDES}
    tcmalloc: dict[str, list[dict[str, bool]]] = {s: [] for s in SIDES}
    for rep in range(a.repeats):
        order = SIDES if rep % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            print(f"\n=== repeat {rep + 1}/{a.repeats}: {side} ===", flush=True)
            if side == "triton":
                results, secs, pre = triton_visit(model, warm, texts, levels, a.max_tokens, logs)
            else:
                results, secs, pre = bare_visit(spec, engine_env, logs)
            for run, counts in results:
                _check(side, run.concurrency, counts, a.requests, a.max_tokens)
                runs.append((rep, run))
            ready[side].append(secs)
            tcmalloc[side].append(pre)

    out = report(runs, levels, a)
    print("\nready after (s): " + "   ".join(f"{s}: {' '.join(f'{x:.0f}' for x in v)}" for s, v in ready.items()))
    for s in SIDES:
        last = tcmalloc[s][-1]
        yes = [k for k, v in last.items() if v]
        no = [k for k, v in last.items() if not v]
        print(f"tcmalloc mapped ({s}'s processes, last visit): in {', '.join(yes) or 'none'};"
              f" not in {', '.join(no) or 'none'}")
    if a.json:
        raw = [{"repeat": rep, **asdict(r), "tok_s": r.tok_s, "ttft_p50_ms": r.ttft(0.5)} for rep, r in runs]
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "settings": {"levels": levels, "repeats": a.repeats, "requests": a.requests,
                         "max_tokens": a.max_tokens, "input_words": a.input_words, "cpus": os.cpu_count(),
                         "model": model, "engine_args": engine_args, "engine_env": engine_env,
                         "stream_interval_s": stream_interval_s, "coalesce_from": coalesce_from},
            "runs": raw, **out, "ready_s": ready, "tcmalloc": tcmalloc}, indent=2))
        print(f"raw figures: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
