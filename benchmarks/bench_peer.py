"""tritonforge's default against ``vllm serve`` on the same machine, side by side, in ABBA order.

Sides (one server at a time, never two):

* ``triton``         -- Triton's ``generate_stream`` (HTTP SSE) on the default repository,
                        through the HTTP front ``tritonforge serve`` puts on its HTTP port;
* ``triton-direct``  -- the same on tritonserver's own (private) HTTP port behind the front:
                        what the front costs;
* ``gateway``        -- tritonforge's OpenAI gateway over that same Triton (``/v1/completions``);
* ``vllm-defaults``  -- ``vllm serve`` with its own defaults (torch.compile, chunked prefill,
                        prefix caching) on the same prepared model folder;
* ``vllm-spec``      -- ``vllm serve`` with the default spec's engine arguments (read from the
                        repository's engine config) and the allocator tritonforge's engine
                        model preloads (tcmalloc, ``runtime.preload``), i.e. identical engine
                        settings (on this CPU that includes running the model inside
                        vLLM's engine-core process: ``--distributed-executor-backend uni``
                        with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as the spec renders it);
                        ``vllm-defaults`` runs as a user starts it, with none of these
                        (vLLM's CPU platform then runs the model in a worker process of its
                        own, driven by the engine core through shared memory) and with
                        vLLM's own OpenMP placement: ``server_environment``'s
                        ``VLLM_CPU_OMP_THREADS_BIND=nobind`` is removed, so vLLM's "auto"
                        keeps one core for its engine core and pins the model's threads to
                        the others; the only variable it gets is ``VLLM_CPU_KVCACHE_SPACE``,
                        which vLLM's CPU backend needs to start.

Both ``vllm serve`` sides keep vLLM's statistics on (its default; earlier runs passed
``--disable-log-stats``): tritonforge's engine model runs vLLM with statistics on too, for its
metrics, so a peer without them did less work per step than the side it was compared with.

``triton``, ``triton-direct`` and ``gateway`` share one server visit; the two ``vllm`` sides are a visit each.
Visits run forward, then reversed, then forward ... (A B C, C B A, A B C for three repeats), so
a drift of the machine during the run falls on every side alike. Inside a visit each level runs
after a warm-up, and inside the tritonforge visit the two clients alternate ABBA per level.

One client for every side, written here on aiohttp (not the code under test): the same fixed
prompts, greedy, ``min_tokens = max_tokens = --output-len`` so every request generates exactly
that many tokens. The token count is checked on every request (Triton: the sum of the
responses' ``num_output_tokens``; OpenAI: ``usage.completion_tokens``); a side that generated a
different number of tokens stops the run. The Triton sides' count is the one their own
postprocessing computes, so the work is also checked against vLLM itself: each side's
streamed text for a prompt is compared with the text ``vllm-spec`` (``vllm serve``, greedy, the
same engine settings) streamed for it, and the report prints how many agree per level
(``same_text``). Output tok/s = all output tokens / the level's wall
time; TTFT = request sent -> first non-empty text. Printed: medians over repeats with min-max,
TTFT p50/p95 (medians), the 1-minute load average per level, the host CPU per output token
(user + system seconds, read from /proc, of every process of the serving side's tree except
vLLM's own ``VLLM::`` engine processes: tritonserver, its model stubs, the HTTP front and the
gateway, or ``vllm serve``'s API server; the engine's processes are left out because their
threads spin and fill whatever cores are free, so their CPU says nothing about work), and the
ratios against each vLLM side: of the medians, and the median of each repeat's own ratio (the
two visits of a repeat are close in time, so a machine that speeds up or slows down during the
run moves that ratio least).

    python benchmarks/bench_peer.py                                  # all four sides, 3 repeats
    python benchmarks/bench_peer.py --sides triton vllm-spec --levels 1 8 --repeats 3
    python benchmarks/bench_peer.py --json results/bench-peer.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import (  # type: ignore[import-not-found]
    MODEL_REF,
    REPO,
    engine_settings,
    ensemble_name,
    process,
    vllm_flags,
    wait_http,
)

SIDES = ("triton", "triton-direct", "gateway", "vllm-defaults", "vllm-spec")
VISITS = {"tritonforge": ("triton", "triton-direct", "gateway"), "vllm-defaults": ("vllm-defaults",),
          "vllm-spec": ("vllm-spec",)}
WORDS = ["river", "stone", "light", "market", "garden", "window", "paper", "silver", "morning", "island", "letter", "engine", "winter", "summer", "forest", "bridge", "orange", "pocket", "valley", "number", "planet", "signal", "harbor", "circle", "thunder", "candle", "mirror", "rocket", "button", "ladder", "meadow", "castle", "violin", "pencil", "lantern"]


def prompts(count: int, words: int, seed: int = 0) -> list[str]:
    """Distinct prompts (no shared prefix past the first word, so prefix caching cannot skip work)."""
    rng = random.Random(seed)
    return [f"{i}. " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(count)]


@dataclass
class Run:
    side: str
    concurrency: int
    requests: int
    wall_s: float
    tokens: int
    ttft_ms: list[float] = field(default_factory=list)
    load_1m: float = 0.0
    host_cpu_s: float = 0.0  # CPU seconds of the serving side's non-engine processes during the run
    repeat: int = 0  # which repeat of the benchmark it belongs to (from 0)
    texts: dict[str, str] = field(default_factory=dict)  # prompt -> the text streamed for it

    @property
    def host_ms_per_tok(self) -> float:
        return self.host_cpu_s / self.tokens * 1000

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttft_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _one(session: Any, side: str, base: str, model: str, prompt: str,
               out_len: int) -> tuple[float, int, str]:
    """One streamed request: (TTFT ms, output tokens, the whole text streamed)."""
    t0 = time.perf_counter()
    first: float | None = None
    tokens = 0
    pieces: list[str] = []
    if side.startswith("triton"):
        url = f"{base}/v2/models/{model}/generate_stream"
        body: dict[str, Any] = {"text_input": prompt, "max_tokens": out_len, "min_tokens": out_len,
                                "temperature": 0.0}
    else:
        url = f"{base}/v1/completions"
        body = {"model": model, "prompt": prompt, "max_tokens": out_len, "min_tokens": out_len,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url, json=body) as reply:
        if reply.status != 200:
            raise SystemExit(f"{side}: HTTP {reply.status}: {(await reply.text())[:500]}")
        async for raw in reply.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if side.startswith("triton"):
                if "error" in event:
                    raise SystemExit(f"{side}: {event['error']}")
                text = event.get("text_output", "")
                tokens += int(event.get("num_output_tokens", 0))
            else:
                choices = event.get("choices") or []
                text = choices[0].get("text", "") if choices else ""
                if event.get("usage"):
                    tokens = int(event["usage"]["completion_tokens"])
            if text and first is None:
                first = time.perf_counter()
            pieces.append(text)
    if first is None:
        raise SystemExit(f"{side}: a request streamed no text")
    return (first - t0) * 1000, tokens, "".join(pieces)


async def level(side: str, base: str, model: str, texts: list[str], concurrency: int,
                out_len: int) -> Run:
    import aiohttp

    queue = list(texts)
    ttfts: list[float] = []
    counts: list[int] = []
    streamed: dict[str, str] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                t, n, text = await _one(session, side, base, model, prompt, out_len)
                ttfts.append(t)
                counts.append(n)
                streamed[prompt] = text

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    wrong = [n for n in counts if n != out_len]
    if wrong:
        raise SystemExit(f"{side} c={concurrency}: {len(wrong)} requests generated {sorted(set(wrong))}"
                         f" tokens, not {out_len}: the sides would not do the same work")
    return Run(side, concurrency, len(texts), wall, sum(counts), ttfts, os.getloadavg()[0], texts=streamed)


def host_cpu_s(roots: list[int]) -> float:
    """User + system CPU seconds (/proc) of ``roots`` and every process below them, except
    vLLM's engine processes (named ``VLLM::EngineCore``, ``VLLM::Worker`` ...)."""
    from tritonforge.runtime.procfs import descendants

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in {p for r in roots for p in (r, *descendants(r))}:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if not name.startswith("VLLM::"):
            total += int(fields[11]) + int(fields[12])
    return total / tick


def measure(sides: list[str], bases: dict[str, str], model: str, levels: list[int], per_stream: int,
            out_len: int, in_words: int, flip: bool, roots: list[int], min_requests: int = 16) -> list[Run]:
    runs: list[Run] = []
    for s in sides:  # warm-up: compile graphs, fill allocator pools
        asyncio.run(level(s, bases[s], model, prompts(4, in_words, seed=99), 2, out_len))
    for i, c in enumerate(levels):
        texts = prompts(max(min_requests, c * per_stream), in_words, seed=c)
        order = sides if (i % 2 == 0) != flip else list(reversed(sides))
        for s in (*order, *reversed(order)) if len(order) > 1 else order:
            before = host_cpu_s(roots)
            r = asyncio.run(level(s, bases[s], model, texts, c, out_len))
            r.host_cpu_s = host_cpu_s(roots) - before
            print(f"  {s:>13} c={c:<3} {r.tok_s:8.1f} tok/s  TTFT p50 {r.ttft(0.5):7.0f} ms"
                  f"  p95 {r.ttft(0.95):7.0f} ms  host CPU {r.host_ms_per_tok:5.3f} ms/tok  load {r.load_1m:.2f}",
                  flush=True)
            runs.append(r)
    return runs


def vllm_command(name: str, folder: Path, served: str, port: int,
                 repository: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """``vllm serve`` as side ``name`` (``vllm-defaults`` or ``vllm-spec``, see the module's
    docstring) runs it on ``127.0.0.1:port``: its argv, its environment and the engine flags
    taken from ``repository`` (none for ``vllm-defaults``)."""
    from tritonforge.runtime.server import find_install, server_environment

    engine_args, engine_env = engine_settings(repository)
    if name == "vllm-defaults":  # as a user starts it (see the docstring): only the KV cache size,
        # and vLLM's own OpenMP thread placement rather than server_environment's "nobind"
        env = server_environment(find_install(), {k: v for k, v in engine_env.items()
                                                  if k == "VLLM_CPU_KVCACHE_SPACE"})
        env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        flags: list[str] = []
    else:  # the engine's settings and environment as tritonforge's engine model sets them
        from tritonforge.runtime.preload import with_tcmalloc

        env = server_environment(find_install(), engine_env)
        env["LD_PRELOAD"] = with_tcmalloc(env.get("LD_PRELOAD", ""))
        flags = vllm_flags(engine_args)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--served-model-name", served, "--host", "127.0.0.1", "--port", str(port), *flags]
    return argv, env, flags


def visit(name: str, sides: list[str], model: str, folder: Path, served: str, args: argparse.Namespace,
          starts: dict[str, list[float]], flip: bool) -> list[Run]:
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import free_port

    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if name == "tritonforge":
        import contextlib

        from tritonforge.runtime.server import ServerOptions, TritonServer

        opts = ServerOptions(repository=args.repository, http_port=free_port(), grpc_port=free_port(),
                             metrics_port=free_port(), log_file=logs / "bench-peer-triton.log", front=True)
        server = TritonServer(opts)
        print(f"starting tritonserver ({args.repository}) ...", flush=True)
        server.start()
        with contextlib.ExitStack() as stack:
            stack.callback(server.stop)
            server.wait_ready(timeout=900)
            grpc_url = opts.grpc_url
            bases = {"triton": f"http://127.0.0.1:{opts.http_port}",
                     "triton-direct": f"http://127.0.0.1:{server.triton_http_port}"}
            if "gateway" in sides:
                port = free_port()
                argv = [sys.executable, "-c", "from tritonforge.cli import main; main()", "gateway",
                        "--triton-url", grpc_url, "--model", served, "--port", str(port)]
                env = {k: v for k, v in os.environ.items() if k != "TRITONFORGE_OPENAI_API_KEY"}
                log = logs / "bench-peer-gateway.log"
                proc = stack.enter_context(process(argv, env, log))
                wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc, log)
                bases["gateway"] = f"http://127.0.0.1:{port}"
            starts[name].append(time.monotonic() - t0)
            assert server.process is not None
            roots = [server.process.pid, *([server.front.pid] if server.front else []),
                     *([proc.pid] if "gateway" in sides else [])]
            return measure(sides, bases, model, args.levels, args.per_stream, args.output_len,
                           args.input_words, flip, roots, args.min_requests)
    port = free_port()
    argv, env, flags = vllm_command(name, folder, served, port, args.repository)
    log = logs / f"bench-peer-{name}.log"
    print(f"starting {name}: vllm serve {' '.join(flags) or '(its defaults)'}", flush=True)
    with process(argv, env, log) as proc:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 900, proc, log)
        starts[name].append(time.monotonic() - t0)
        return measure(sides, {name: f"http://127.0.0.1:{port}"}, served, args.levels, args.per_stream,
                       args.output_len, args.input_words, flip, [proc.pid], args.min_requests)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _at(runs: list[Run], side: str, c: int) -> list[Run]:
    """``side``'s runs at level ``c``, in the order they ran."""
    return [r for r in runs if r.side == side and r.concurrency == c]


def _tok_s(runs: list[Run], side: str, c: int) -> list[float]:
    """``side``'s tok/s at level ``c``, one per run, in the order they ran."""
    return [r.tok_s for r in _at(runs, side, c)]


def _per_repeat(runs: list[Run], side: str, c: int) -> dict[int, float]:
    """``side``'s tok/s at level ``c`` in each repeat: the median of its runs there (a visit
    that serves several sides runs each of them twice, in ABBA order)."""
    by: dict[int, list[float]] = {}
    for r in _at(runs, side, c):
        by.setdefault(r.repeat, []).append(r.tok_s)
    return {rep: _med(xs) for rep, xs in by.items()}


def _repeat_ratio(runs: list[Run], ours: str, peer: str, c: int) -> float:
    """The median over repeats of ``ours`` / ``peer`` within each repeat."""
    a, b = _per_repeat(runs, ours, c), _per_repeat(runs, peer, c)
    return _med([a[rep] / b[rep] for rep in sorted(a) if rep in b])


def same_text(runs: list[Run], levels: list[int]) -> dict[str, dict[int, tuple[int, int]]]:
    """For each side other than ``vllm-spec``: at each level, how many of its requests streamed
    exactly the text ``vllm-spec`` streamed for the same prompt in one of its runs at that level.

    The independent check that a side did the work its token count claims: ``vllm-spec`` is
    ``vllm serve`` itself, so its text is vLLM's own output, computed by no code of
    tritonforge's, while the Triton sides' token count is the ``num_output_tokens`` their
    postprocessing reports. Greedy decoding of the same prompt with the same engine settings gives
    the same tokens, so the same text; a batch of several streams may change a near-tie in
    floating point, so above one stream a few requests may differ without anything being wrong
    (``vllm-defaults`` runs other settings, so it is compared too but need not agree)."""
    refs: dict[int, dict[str, set[str]]] = {c: {} for c in levels}  # level -> prompt -> its texts
    for c, ref in refs.items():
        for r in _at(runs, "vllm-spec", c):
            for prompt, text in r.texts.items():
                ref.setdefault(prompt, set()).add(text)
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for side in dict.fromkeys(r.side for r in runs):
        if side == "vllm-spec":
            continue
        per: dict[int, tuple[int, int]] = {}
        for c, ref in refs.items():
            pairs = [(prompt, text) for r in _at(runs, side, c)
                     for prompt, text in r.texts.items() if prompt in ref]
            if pairs:
                per[c] = (sum(text in ref[prompt] for prompt, text in pairs), len(pairs))
        if per:
            out[side] = per
    return out


def report(runs: list[Run], sides: list[str], levels: list[int], args: argparse.Namespace,
           starts: dict[str, list[float]]) -> dict[str, Any]:
    table: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in sides}
    for s in sides:
        for c in levels:
            rs = _at(runs, s, c)
            tok = [r.tok_s for r in rs]
            table[s][c] = {"tok_s": _med(tok), "tok_s_min": min(tok), "tok_s_max": max(tok),
                           "ttft_p50_ms": _med([r.ttft(0.5) for r in rs]),
                           "ttft_p95_ms": _med([r.ttft(0.95) for r in rs]),
                           "load_1m": _med([r.load_1m for r in rs]), "repeats": len(rs),
                           "host_cpu_ms_per_tok": _med([r.host_ms_per_tok for r in rs]),
                           "tokens_per_run": rs[0].tokens}
    print(f"\n{args.output_len} output tokens per request (checked on every request), greedy, "
          f"{args.input_words}-word prompts, {args.per_stream} requests per stream (at least "
          f"{args.min_requests} per level); medians of "
          f"repeats (min-max); {os.cpu_count()} CPUs; repository {args.repository}")
    print(f"{'side':>13} {'conc':>4} | {'tok/s':>7} {'(min-max)':>15} | {'TTFT p50':>8} {'p95':>7} ms"
          f" | {'host CPU ms/tok':>15} | {'load':>5} | runs")
    for s in sides:
        for c in levels:
            t = table[s][c]
            print(f"{s:>13} {c:>4} | {t['tok_s']:7.1f} ({t['tok_s_min']:6.1f}-{t['tok_s_max']:6.1f}) |"
                  f" {t['ttft_p50_ms']:8.0f} {t['ttft_p95_ms']:7.0f}    | {t['host_cpu_ms_per_tok']:15.3f} |"
                  f" {t['load_1m']:5.2f} | {t['repeats']}")
    ratios: dict[str, dict[int, dict[str, float]]] = {}
    for ours in ("triton", "triton-direct", "gateway"):
        for peer in ("triton-direct", "vllm-defaults", "vllm-spec") if ours == "triton" else ("vllm-defaults", "vllm-spec"):
            if ours in table and peer in table:
                key = f"{ours}/{peer}"
                ratios[key] = {c: {"tok_s": table[ours][c]["tok_s"] / table[peer][c]["tok_s"],
                                   "tok_s_per_repeat": _repeat_ratio(runs, ours, peer, c),
                                   "ttft_p50": table[ours][c]["ttft_p50_ms"] / table[peer][c]["ttft_p50_ms"]}
                               for c in levels}
    if ratios:
        print("\nratios (tok/s: higher is better, in brackets the median of each repeat's own ratio -- a "
              "repeat visits both servers close in time, so drift spares it; TTFT p50: lower is better)")
        for key, per in ratios.items():
            cells = "  ".join(f"c={c}: {v['tok_s']:.2f} ({v['tok_s_per_repeat']:.2f}) / {v['ttft_p50']:.2f}"
                              for c, v in per.items())
            print(f"  {key:>26}  {cells}")
    same = same_text(runs, levels)
    if same:
        print("\nsame text as `vllm serve` with the same settings (vLLM's own output for the same prompt,"
              " greedy; requests whose whole streamed text equals it / requests compared):")
        for side, agree in same.items():
            print(f"  {side:>26}  " + "  ".join(f"c={c}: {k}/{n}" for c, (k, n) in agree.items()))
    print("\nserver ready after (s): " + ", ".join(
        f"{k}: {' '.join(f'{x:.0f}' for x in v)}" for k, v in starts.items() if v)
        + "  (first visit pays compile caches)")
    return {"table": table, "ratios": ratios, "same_text": same, "starts_s": starts, "output_len": args.output_len,
            "cpus": os.cpu_count(), "runs": [dataclasses.asdict(r) for r in runs]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--levels", nargs="+", type=int, default=[1, 8, 16, 32])
    p.add_argument("--repeats", type=int, default=3, help="visits per server (ABBA order); >= 3 for a median")
    p.add_argument("--per-stream", type=int, default=2, help="requests per concurrent stream per level")
    p.add_argument("--min-requests", type=int, default=16,
                   help="requests per level at least (c1 with --per-stream alone gives a TTFT p50 of a few samples)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--input-words", type=int, default=40)
    p.add_argument("--json", type=Path)
    p.add_argument("--repository", type=Path, default=REPO,
                   help="a generated vLLM repository to serve, and whose engine settings vllm-spec uses "
                        "(default: model_repository/; its model must be the default's)")
    a = p.parse_args()

    from tritonforge.runtime.models import resolve_model

    folder = resolve_model(MODEL_REF)
    served = ensemble_name(a.repository)
    visits = [v for v, ss in VISITS.items() if any(s in a.sides for s in ss)]
    starts: dict[str, list[float]] = {v: [] for v in visits}
    runs: list[Run] = []
    for rep in range(a.repeats):
        order = visits if rep % 2 == 0 else list(reversed(visits))
        for v in order:
            sides = [s for s in VISITS[v] if s in a.sides]
            print(f"\n=== repeat {rep + 1}/{a.repeats}: {v} ({', '.join(sides)}) ===", flush=True)
            got = visit(v, sides, served, folder, served, a, starts, flip=rep % 2 == 1)
            for r in got:
                r.repeat = rep
            runs += got
    out = report(runs, a.sides, a.levels, a, starts)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
