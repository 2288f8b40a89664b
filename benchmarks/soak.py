"""Soak: N concurrent streams against a running server for a bounded time.

Counts streams, tokens and errors, and samples the server's memory: the summed resident
set size of the tritonserver process group (tritonserver, Python backend stubs, vLLM engine
processes), found from the process that listens on the server's gRPC port (/proc). Prints
the figures; exits 1 on any error or when memory grew more than ``--max-growth-mib``.

    python benchmarks/soak.py --grpc 127.0.0.1:8001 --model smollm2 --minutes 10

The test suite runs the same loop for 60 s (tests/test_reliability_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


def group_rss_bytes(pgid: int) -> int:
    """Sum of resident memory of every process in process group ``pgid``."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid:  # field 5 (pgrp), counted after the command name
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

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_end_mib - self.rss_start_mib


async def _soak(url: str, model: str, seconds: float, concurrency: int, pgid: int | None,
                max_tokens: int, seed: int) -> SoakResult:
    from tritonforge.clients import AsyncClient, Request

    result = SoakResult(seconds=seconds, concurrency=concurrency)
    rng = random.Random(seed)
    mib = 1024 * 1024

    def sample() -> float:
        value = group_rss_bytes(pgid) / mib if pgid is not None else 0.0
        result.rss_samples_mib.append(round(value, 1))
        result.rss_peak_mib = max(result.rss_peak_mib, value)
        return value

    result.rss_start_mib = sample()
    end = time.monotonic() + seconds
    async with AsyncClient(url, model=model, timeout=300) as client:

        async def worker() -> None:
            while time.monotonic() < end:
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
    await asyncio.sleep(2)  # let the server settle before the last sample
    result.rss_end_mib = sample()
    return result


def run_soak(grpc_url: str, model: str, *, seconds: float, concurrency: int = 16, max_tokens: int = 64,
             seed: int = 1, measure_memory: bool = True) -> SoakResult:
    """Run the soak loop; memory is sampled when this machine can see the server's processes."""
    pgid = None
    if measure_memory:
        pid = listening_pid(int(grpc_url.rsplit(":", 1)[1]))
        pgid = os.getpgid(pid) if pid is not None else None
    return asyncio.run(_soak(grpc_url, model, seconds, concurrency, pgid, max_tokens, seed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc", default="127.0.0.1:8001", help="gRPC address of the server")
    parser.add_argument("--model", default="smollm2", help="ensemble name")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup-seconds", type=float, default=30.0,
                        help="run this long first, so allocator warm-up is not counted as growth")
    parser.add_argument("--max-growth-mib", type=float, default=256.0)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.warmup_seconds > 0:
        run_soak(args.grpc, args.model, seconds=args.warmup_seconds, concurrency=args.concurrency,
                 max_tokens=args.max_tokens, measure_memory=False)
    res = run_soak(args.grpc, args.model, seconds=args.minutes * 60, concurrency=args.concurrency,
                   max_tokens=args.max_tokens)
    print(f"soak: {res.seconds / 60:.1f} min, {res.concurrency} concurrent streams: {res.streams} streams, "
          f"{res.tokens} tokens, {res.errors} errors")
    print(f"server RSS (process group): start {res.rss_start_mib:.0f} MiB, end {res.rss_end_mib:.0f} MiB, "
          f"peak {res.rss_peak_mib:.0f} MiB, growth {res.rss_growth_mib:+.0f} MiB "
          f"(bound {args.max_growth_mib:.0f} MiB)")
    for sample in res.error_samples:
        print(f"  error: {sample}")
    if args.json:
        data = asdict(res) | {"rss_growth_mib": res.rss_growth_mib}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 1 if res.errors or res.rss_growth_mib > args.max_growth_mib else 0


if __name__ == "__main__":
    sys.exit(main())
