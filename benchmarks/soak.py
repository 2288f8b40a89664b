"""Soak: N concurrent streams against a running server for a bounded time.

Counts streams, tokens and errors, and samples the server's memory: the summed resident
set size of the tritonserver process group (tritonserver, Python backend stubs, vLLM engine
processes), found from the process that listens on the server's gRPC port (/proc), and of
the group of the process listening on ``--http`` (``serve``'s HTTP front). With
``--drop-fraction`` a share of the streams are dropped mid-stream by a random kind of client
(typed gRPC/HTTP clients leaving, a bare gRPC stream cancelled, a plain ``ModelInfer`` on the
non-streaming ``<model>_sync`` cancelled, a plain HTTP ``/generate`` on it whose connection
is closed, bare HTTP SSE connections
closed on the ensemble and on the BLS model, the OpenAI gateway's client with
``--gateway``). Prints the figures, the RSS slope fitted over all samples (least squares,
MiB/min) and the engine's own gauges at the end; exits 1 on any error, when memory grew more
than ``--max-growth-mib`` or its slope exceeds ``--max-slope``, or when the engine is not
idle at the end.

    python benchmarks/soak.py --grpc 127.0.0.1:8001 --http 127.0.0.1:8000 \
        --metrics 127.0.0.1:8002 --model smollm2 --minutes 10 --drop-fraction 0.3

The test suite runs the same loop for 60 s (tests/test_reliability_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SoakResult", "group_rss_bytes", "listening_pid", "main", "run_soak"]

PROMPTS = (
    "Once upon a time, there was a little",
    "Explain what a lighthouse does in three sentences.",
    "Write a haiku about the sea.",
    "List five uses of a paperclip.",
    "What is the capital of France?",
    "Describe a sunrise over the mountains.",
)
_PAGE = os.sysconf("SC_PAGE_SIZE")


def listening_pid(port: int) -> int | None:
    """PID of the process that has a socket listening on ``port`` (needs /proc access)."""
    from tritonforge.runtime.doctor import listeners

    inodes = {inode for _, inode in listeners(port)}
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(proc.name)
        except OSError:
            continue
    return None


def group_rss_bytes(pgids: set[int]) -> int:
    """Sum of resident memory of every process in the process groups ``pgids``."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) not in pgids:  # field 5 (pgrp), counted after the command name
                continue
            total += int((proc / "statm").read_text().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class SoakResult:
    seconds: float
    concurrency: int
    streams: int = 0
    tokens: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_samples_mib: list[float] = field(default_factory=list)
    rss_sample_times: list[float] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_end_mib - self.rss_start_mib

    @property
    def rss_slope_mib_per_min(self) -> float:
        """Least-squares slope of RSS over time, over every sample."""
        import statistics

        if len(self.rss_samples_mib) < 3:
            return 0.0
        minutes = [t / 60 for t in self.rss_sample_times]
        return statistics.linear_regression(minutes, self.rss_samples_mib).slope


DROP_KINDS = ("typed-grpc", "typed-http", "grpc-stream", "sync-grpc", "sync-http", "http-sse", "bls-http-sse",
              "gateway")


async def _drop(kind: str, urls: dict[str, str], model: str, clients: dict[str, object],
                rng: random.Random) -> None:
    """One stream dropped after a few chunks by a client of ``kind``."""
    import httpx

    k = rng.randint(1, 6)
    prompt = rng.choice(PROMPTS)
    body = {"text_input": prompt, "max_tokens": 512, "min_tokens": 512}
    if kind in ("typed-grpc", "typed-http"):
        client: Any = clients[kind]
        async with client.stream(prompt, max_tokens=512, min_tokens=512) as stream:
            async for chunk in stream:
                if chunk.index >= k:
                    break
    elif kind in ("grpc-stream", "sync-grpc"):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        req = service_pb2.ModelInferRequest(model_name=model if kind == "grpc-stream" else f"{model}_sync")
        t = req.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
        t.contents.bytes_contents.append(prompt.encode())
        for name in ("max_tokens", "min_tokens"):
            t = req.inputs.add(name=name, datatype="INT32", shape=[1, 1])
            t.contents.int_contents.append(512)
        async with grpc.aio.insecure_channel(urls["grpc"]) as channel:
            if kind == "sync-grpc":  # the non-streaming model: a plain ModelInfer, cancelled mid-way
                unary = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req)
                await asyncio.sleep(0.2 * k)
                if unary.done():
                    raise RuntimeError("sync-grpc: a 512-token request ended before it was dropped")
                unary.cancel()
                return
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([req]))
            n = 0
            async for response in call:
                if response.error_message:
                    raise RuntimeError(response.error_message)
                n += 1
                if n >= k:
                    break
            call.cancel()
    elif kind == "sync-http":  # the non-streaming model over plain HTTP /generate, left mid-way
        async with httpx.AsyncClient(timeout=120) as http:
            post = asyncio.ensure_future(http.post(f"http://{urls['http']}/v2/models/{model}_sync/generate", json=body))
            await asyncio.sleep(0.2 * k)
            if post.done():
                raise RuntimeError(f"sync-http: a 512-token request ended before it was dropped: {post.result()}")
            post.cancel()  # closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                await post
    else:
        if kind == "gateway":
            url = f"{urls['gateway']}/completions"
            body = {"model": model, "prompt": prompt, "max_tokens": 512, "min_tokens": 512, "stream": True}
        else:
            target = model if kind == "http-sse" else "tensorrt_llm_bls"
            url = f"http://{urls['http']}/v2/models/{target}/generate_stream"
        async with httpx.AsyncClient(timeout=120) as http, http.stream("POST", url, json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"{kind}: HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
            n = 0
            async for line in reply.aiter_lines():
                if line.startswith("data:"):
                    n += 1
                    if n >= k:
                        break


def engine_gauges(metrics_url: str) -> dict[str, float]:
    """The engine's running/waiting gauges (vLLM's scheduler report) on the metrics port."""
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("tritonforge_engine_requests_running", "tritonforge_engine_requests_waiting"):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def _soak(url: str, model: str, seconds: float, concurrency: int, pgids: set[int],
                max_tokens: int, seed: int, drop_fraction: float = 0.0,
                urls: dict[str, str] | None = None) -> SoakResult:
    from tritonforge.clients import AsyncClient, Request

    result = SoakResult(seconds=seconds, concurrency=concurrency)
    rng = random.Random(seed)
    mib = 1024 * 1024
    urls = {"grpc": url, **(urls or {})}
    kinds = [k for k in DROP_KINDS if (k != "gateway" or "gateway" in urls)
             and (k not in ("typed-http", "sync-http", "http-sse", "bls-http-sse") or "http" in urls)]
    t_start = time.monotonic()

    def sample() -> float:
        value = group_rss_bytes(pgids) / mib if pgids else 0.0
        result.rss_samples_mib.append(round(value, 1))
        result.rss_sample_times.append(round(time.monotonic() - t_start, 1))
        result.rss_peak_mib = max(result.rss_peak_mib, value)
        return value

    result.rss_start_mib = sample()
    end = time.monotonic() + seconds
    clients: dict[str, object] = {}
    async with AsyncClient(url, model=model, timeout=300) as client:
        clients["typed-grpc"] = client
        http_client = AsyncClient(urls["http"], protocol="http", model=model, timeout=300) if "http" in urls else None
        if http_client is not None:
            clients["typed-http"] = await http_client.__aenter__()

        async def worker() -> None:
            while time.monotonic() < end:
                if drop_fraction and rng.random() < drop_fraction:
                    kind = rng.choice(kinds)
                    try:
                        await _drop(kind, urls, model, clients, rng)
                        result.drops[kind] = result.drops.get(kind, 0) + 1
                    except Exception as exc:  # noqa: BLE001 - every error counts
                        result.errors += 1
                        if len(result.error_samples) < 5:
                            result.error_samples.append(f"drop {kind}: {type(exc).__name__}: {exc}")
                    continue
                # Chat messages (the model is an instruct model: a bare instruction may be
                # answered by an immediate end-of-sequence); min_tokens=1 so every stream has
                # output and an empty one is an error.
                request = Request(messages=[{"role": "user", "content": rng.choice(PROMPTS)}])
                try:
                    async with client.stream(request, max_tokens=rng.randint(8, max_tokens), min_tokens=1,
                                             temperature=rng.choice((0.0, 0.7))) as s:
                        async for _ in s:
                            pass
                        done = s.completion
                    result.streams += 1
                    result.tokens += done.completion_tokens
                    if done.completion_tokens <= 0:
                        raise RuntimeError("a stream ended without tokens")
                except Exception as exc:  # noqa: BLE001 - every error counts
                    result.errors += 1
                    if len(result.error_samples) < 5:
                        result.error_samples.append(f"{type(exc).__name__}: {exc}")

        async def sampler() -> None:
            while True:
                await asyncio.sleep(5)
                sample()

        watch = asyncio.create_task(sampler())
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        watch.cancel()
        if http_client is not None:
            await http_client.__aexit__(None, None, None)
    await asyncio.sleep(2)  # let the server settle before the last sample
    result.rss_end_mib = sample()
    return result


def run_soak(grpc_url: str, model: str, *, seconds: float, concurrency: int = 16, max_tokens: int = 64,
             seed: int = 1, measure_memory: bool = True, drop_fraction: float = 0.0,
             urls: dict[str, str] | None = None) -> SoakResult:
    """Run the soak loop; memory is sampled when this machine can see the server's processes.
    ``urls`` may name ``http`` (host:port) and ``gateway`` (base URL ending in /v1) for drops."""
    pgids: set[int] = set()
    if measure_memory:  # tritonserver's group; serve's HTTP front, when there is one, is its own
        for address in (grpc_url, (urls or {}).get("http")):
            pid = listening_pid(int(address.rsplit(":", 1)[1])) if address else None
            if pid is not None:
                pgids.add(os.getpgid(pid))
    return asyncio.run(_soak(grpc_url, model, seconds, concurrency, pgids, max_tokens, seed,
                             drop_fraction, urls))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:8001", help="gRPC address of the server")
    parser.add_argument("--model", default="smollm2", help="ensemble name")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup-seconds", type=float, default=30.0,
                        help="run the same load (drops included) this long first, so that caches "
                             "filling up are not counted as growth")
    parser.add_argument("--max-growth-mib", type=float, default=256.0)
    parser.add_argument("--max-slope", type=float, default=1.0, help="MiB/min, fitted over all samples")
    parser.add_argument("--http", help="HTTP address of the server (for HTTP drops)")
    parser.add_argument("--metrics", help="metrics address: the engine must be idle at the end")
    parser.add_argument("--gateway", help="OpenAI gateway base URL, e.g. http://127.0.0.1:9000/v1")
    parser.add_argument("--drop-fraction", type=float, default=0.0,
                        help="share of streams dropped mid-stream by a random kind of client")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    urls = {k: v for k, v in (("http", args.http), ("gateway", args.gateway)) if v}
    if args.warmup_seconds > 0:
        # The same mix as the measured run: dropped streams are 512 tokens long, and vLLM's
        # worker grows while it first meets them (measured: flat through 10 minutes of short
        # streams, then growing as soon as the drops began).
        run_soak(args.grpc, args.model, seconds=args.warmup_seconds, concurrency=args.concurrency,
                 max_tokens=args.max_tokens, measure_memory=False, seed=2,
                 drop_fraction=args.drop_fraction, urls=urls)
    res = run_soak(args.grpc, args.model, seconds=args.minutes * 60, concurrency=args.concurrency,
                   max_tokens=args.max_tokens, drop_fraction=args.drop_fraction, urls=urls)
    idle = True
    if args.metrics:
        deadline = time.monotonic() + 15
        gauges = engine_gauges(args.metrics)
        while any(gauges.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            gauges = engine_gauges(args.metrics)
        idle = not any(gauges.values())
        print(f"engine at the end (vLLM's scheduler): {gauges}")
    print(f"soak: {res.seconds / 60:.1f} min, {res.concurrency} concurrent streams: {res.streams} streams, "
          f"{res.tokens} tokens, {res.errors} errors")
    print(f"server RSS (process group): start {res.rss_start_mib:.0f} MiB, end {res.rss_end_mib:.0f} MiB, "
          f"peak {res.rss_peak_mib:.0f} MiB, growth {res.rss_growth_mib:+.0f} MiB "
          f"(bound {args.max_growth_mib:.0f} MiB); slope over {len(res.rss_samples_mib)} samples "
          f"{res.rss_slope_mib_per_min:+.2f} MiB/min (bound {args.max_slope:.1f})")
    if res.drops:
        print(f"dropped mid-stream: {sum(res.drops.values())} ({res.drops})")
    for sample in res.error_samples:
        print(f"  error: {sample}")
    if args.json:
        data = asdict(res) | {"rss_growth_mib": res.rss_growth_mib,
                              "rss_slope_mib_per_min": res.rss_slope_mib_per_min}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    bad = res.errors or res.rss_growth_mib > args.max_growth_mib or res.rss_slope_mib_per_min > args.max_slope
    return 1 if bad or not idle else 0


if __name__ == "__main__":
    sys.exit(main())
