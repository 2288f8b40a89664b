"""The OpenAI gateway over Triton vs vLLM's own OpenAI server, same model, same client.

vLLM's benchmark client (``vllm.benchmarks.serve``, backend ``openai-chat``, random
prompts, ``ignore_eos`` so every request generates exactly ``--output-len`` tokens, greedy)
is run through its Python API against

* ``tritonforge gateway`` (its own process) over tritonserver serving the default
  repository (SmolLM2-135M-Instruct on vLLM, CPU), and
* ``python -m vllm.entrypoints.openai.api_server`` on the same prepared model folder with
  the same engine arguments (read from the repository's engine config) and environment,

at each concurrency level, and prints output tok/s and mean TTFT side by side with the
ratios gateway/vLLM (goal: tok/s ratio >= 1.0). The two servers run one after the other,
never at the same time: Triton (started here unless ``--triton-url`` is given) is stopped
before vLLM's server starts.

    python benchmarks/bench_gateway.py                       # starts and stops everything
    python benchmarks/bench_gateway.py --triton-url 127.0.0.1:8001 --model smollm2
    python benchmarks/bench_gateway.py --levels 1:4 8:16 32:32 --input-len 64 --output-len 64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "model_repository"
MODEL_REF = "package:smollm2-135m-instruct"
_ENGINE_ARGS = re.compile(r'key:\s*"tritonforge_engine_args"\s*value\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')
_ENGINE_ENV = re.compile(r'key:\s*"tritonforge_engine_env"\s*value\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')


def _pbtxt_json(pattern: re.Pattern[str], text: str) -> dict[str, Any]:
    m = pattern.search(text)
    return {} if m is None else dict(json.loads(m.group(1).encode().decode("unicode_escape")))


def engine_settings(repo: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The engine arguments and environment the repository's vLLM engine model uses."""
    from tritonforge.contract import MODEL_VLLM_ENGINE

    text = (repo / MODEL_VLLM_ENGINE / "config.pbtxt").read_text()
    return _pbtxt_json(_ENGINE_ARGS, text), {k: str(v) for k, v in _pbtxt_json(_ENGINE_ENV, text).items()}


def vllm_flags(engine_args: dict[str, Any]) -> list[str]:
    """AsyncEngineArgs fields as vLLM server flags (``--no-x`` for a false boolean)."""
    out: list[str] = []
    for key, value in sorted(engine_args.items()):
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None,
              log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise SystemExit(f"{url}: the server exited with {proc.returncode}\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} was not ready within {timeout:.0f} s")


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server process in its own group, stopped (SIGTERM, then SIGKILL) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def ensemble_name(repo: Path) -> str:
    """The repository's streaming ensemble (not its ``_sync`` twin)."""
    names = sorted(cfg.parent.name for cfg in repo.glob("*/config.pbtxt")
                   if 'platform: "ensemble"' in cfg.read_text())
    main = [n for n in names if not (n.endswith("_sync") and n[:-5] in names)]
    if len(main) != 1:
        raise SystemExit(f"{repo}: expected one streaming ensemble, found {names}")
    return main[0]


@contextlib.contextmanager
def triton(url: str | None) -> Iterator[str]:
    """Triton's gRPC url: the given server, or one started here on free ports."""
    if url is not None:
        yield url
        return
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    log = cache_dir() / "logs" / "bench-gateway-triton.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    opts = ServerOptions(repository=REPO, http_port=free_port(), grpc_port=free_port(),
                         metrics_port=free_port(), log_file=log)
    server = TritonServer(opts)
    print(f"starting tritonserver ({REPO.name}) ...", flush=True)
    server.start()
    try:
        server.wait_ready(timeout=900)
        yield opts.grpc_url
    finally:
        server.stop()


def bench(base_url: str, folder: Path, served: str, concurrency: int, prompts: int,
          input_len: int, output_len: int) -> dict[str, Any]:
    """One run of vLLM's benchmark client; its result dict."""
    from vllm.benchmarks import serve as vbench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    vbench.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", base_url,
        "--model", str(folder), "--served-model-name", served, "--tokenizer", str(folder),
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
        "--num-warmups", str(min(concurrency, 2)), "--seed", "0", "--disable-tqdm",
    ])
    result: dict[str, Any] = vbench.main(args)
    if result.get("failed"):
        errors = [e for e in result.get("errors", []) if e]
        raise SystemExit(f"{base_url}: {result['failed']} requests failed: {errors[:2]}")
    return result


def run_levels(name: str, base_url: str, folder: Path, served: str, levels: list[tuple[int, int]],
               input_len: int, output_len: int) -> dict[int, dict[str, Any]]:
    out = {}
    for c, n in levels:
        print(f"\n=== {name}: concurrency {c}, {n} requests ===", flush=True)
        r = bench(base_url, folder, served, c, n, input_len, output_len)
        out[c] = {"tok_s": float(r["output_throughput"]), "ttft_ms": float(r["mean_ttft_ms"]),
                  "completed": int(r["completed"]), "output_tokens": int(r["total_output_tokens"]),
                  # the machine may be shared: the 1-minute load average after the level
                  "load_1m": os.getloadavg()[0]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--triton-url", help="use this running Triton (gRPC host:port) instead of starting one")
    p.add_argument("--model", help="the ensemble to serve (default: the one served)")
    p.add_argument("--levels", nargs="+", default=["1:4", "8:16", "32:32"],
                   help="CONCURRENCY:REQUESTS pairs (default: 1:4 8:16 32:32)")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--servers", nargs="+", choices=["gateway", "vllm"], default=["gateway", "vllm"],
                   help="which servers to measure (ratios need both)")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    a = p.parse_args()
    levels = [(int(c), int(n)) for c, n in (lv.split(":") for lv in a.levels)]

    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import find_install, free_port, server_environment

    folder = resolve_model(MODEL_REF)
    engine_args, engine_env = engine_settings(REPO)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    served = a.model or ensemble_name(REPO)
    results: dict[str, dict[int, dict[str, Any]]] = {}

    # -- the gateway over Triton ---------------------------------------------------------
    if "gateway" in a.servers:
        with triton(a.triton_url) as grpc_url:
            port = free_port()
            argv = [sys.executable, "-c", "from tritonforge.cli import main; main()", "gateway",
                    "--triton-url", grpc_url, "--model", served, "--port", str(port)]
            env = {k: v for k, v in os.environ.items() if k != "TRITONFORGE_OPENAI_API_KEY"}
            log = logs / "bench-gateway.log"
            with process(argv, env, log) as proc:
                wait_http(f"http://127.0.0.1:{port}/v1/models", 120, proc, log)
                results["gateway"] = run_levels("tritonforge gateway", f"http://127.0.0.1:{port}",
                                                folder, served, levels, a.input_len, a.output_len)

    # -- vLLM's own OpenAI server (after Triton has stopped) ------------------------------
    if "vllm" in a.servers:
        port = free_port()
        env = server_environment(find_install(), engine_env)
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                "--served-model-name", served, "--host", "127.0.0.1", "--port", str(port),
                "--disable-log-stats", *vllm_flags(engine_args)]
        log = logs / "bench-gateway-vllm.log"
        print(f"\nstarting vLLM's OpenAI server: {' '.join(argv[1:])}", flush=True)
        with process(argv, env, log) as proc:
            wait_http(f"http://127.0.0.1:{port}/v1/models", 900, proc, log)
            results["vllm"] = run_levels("vLLM api_server", f"http://127.0.0.1:{port}", folder, served,
                                         levels, a.input_len, a.output_len)

    # -- the figures ---------------------------------------------------------------------
    print(f"\nvLLM benchmark client, openai-chat, random {a.input_len} in / {a.output_len} out tokens,"
          " greedy, ignore_eos")
    if len(results) < 2:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'conc':>4} {'reqs':>4} | {'gateway tok/s':>13} {'vLLM tok/s':>10} {'ratio':>6} |"
          f" {'gateway TTFT ms':>15} {'vLLM TTFT ms':>12} {'ratio':>6} | {'load gw':>7} {'load vL':>7}")
    rows = []
    for c, n in levels:
        g, v = results["gateway"][c], results["vllm"][c]
        row = {"concurrency": c, "requests": n, "gateway": g, "vllm": v,
               "tok_s_ratio": g["tok_s"] / v["tok_s"], "ttft_ratio": g["ttft_ms"] / v["ttft_ms"]}
        rows.append(row)
        print(f"{c:>4} {n:>4} | {g['tok_s']:>13.1f} {v['tok_s']:>10.1f} {row['tok_s_ratio']:>6.2f} |"
              f" {g['ttft_ms']:>15.0f} {v['ttft_ms']:>12.0f} {row['ttft_ratio']:>6.2f} |"
              f" {g['load_1m']:>7.1f} {v['load_1m']:>7.1f}")
    print("ratios are gateway / vLLM: tok/s higher is better (goal >= 1.0), TTFT lower is better;"
          f" load: 1-minute load average after each level ({os.cpu_count()} CPUs)")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
