"""Soak: 16 concurrent streams for 60 s with 0 errors and bounded server memory growth.

Memory is the summed RSS of the tritonserver process group (server, Python backend stubs,
vLLM engine processes), read from /proc. A 15 s warm-up runs first so the allocators'
first growth is not counted. The bound (MAX_GROWTH_MIB) is stated here and printed; the
10-minute version is ``python benchmarks/soak.py --minutes 10``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
SECONDS = 60.0
WARMUP = 15.0
CONCURRENCY = 16
MAX_GROWTH_MIB = 256.0  # the stated bound for 60 s of streaming on this CPU deployment


def _soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tritonforge_soak", ROOT / "benchmarks" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_group_rss_counts_this_process() -> None:
    import os

    soak = _soak_module()
    rss = soak.group_rss_bytes({os.getpgid(0)})
    assert rss > 10 * 1024 * 1024  # this Python alone is bigger than 10 MiB


def test_soak_sixteen_streams_no_errors_bounded_memory(triton_server: Any) -> None:
    soak = _soak_module()
    port = int(triton_server.grpc_url.rsplit(":", 1)[1])
    assert soak.listening_pid(port) is not None, "cannot see the server's processes in /proc"
    soak.run_soak(triton_server.grpc_url, triton_server.model, seconds=WARMUP, concurrency=CONCURRENCY,
                  measure_memory=False)
    res = soak.run_soak(triton_server.grpc_url, triton_server.model, seconds=SECONDS,
                        concurrency=CONCURRENCY)
    print(f"\nsoak: {SECONDS:.0f} s, {CONCURRENCY} concurrent streams: {res.streams} streams, {res.tokens} "
          f"tokens, {res.errors} errors; server RSS start {res.rss_start_mib:.0f} MiB, end "
          f"{res.rss_end_mib:.0f} MiB, peak {res.rss_peak_mib:.0f} MiB, growth {res.rss_growth_mib:+.0f} MiB "
          f"(bound {MAX_GROWTH_MIB:.0f} MiB); samples {res.rss_samples_mib}")
    assert res.errors == 0, res.error_samples
    assert res.streams >= CONCURRENCY, "the soak did not complete a round of streams"
    assert res.rss_start_mib > 500, "the server's memory was not measured"
    assert res.rss_growth_mib < MAX_GROWTH_MIB
