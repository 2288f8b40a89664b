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

The other burners ask what Triton's own mechanics cost, with no tritonforge logic and no model:
``--burner floor`` starts a second ``tritonserver`` (behind the same HTTP front ``serve`` puts
on its port) on a repository of no-op Python models shaped like the default ensemble --
``pre`` -> decoupled ``engine`` -> ``post``, the engine sending one response per token, each
through ``post`` -- and streams ``generate_stream`` requests from it, one at a time, beside
``vllm serve`` at c=1. The floor's engine sends one response every ``--pace-ms`` (default:
``vllm serve``'s own time per output token, measured first), so the floor carries the
responses a Triton path at that speed would. ``--burner single`` does the same with one
decoupled Python model and no ensemble. Whatever tritonforge's models do, its Triton path costs
at least the floor's mechanics, on top of vLLM's own engine-client work (which ``vllm serve``'s
API server does too): so the ratio printed for the floor bounds what the Triton path can reach
at c=1 from above, give or take the part of ``vllm serve``'s API-server work (HTTP, JSON) that
the floor's Triton and front do instead.

Printed: every run (tok/s, output tokens checked on every request by bench_peer's client,
TTFT p50, the 1-minute load average, the burner's ms per output token -- for the floor and
single burners, the server side's (tritonserver, its stubs and the front) and its raw-socket
client's apart, and the responses of every floor request checked), then per level the medians
with and without the burner, their ratio, and the median of each repeat's own ratio.

    python benchmarks/bench_host_tax.py                          # c1, 1 ms every 11.6 ms, 3 repeats
    python benchmarks/bench_host_tax.py --levels 1 32 --burn-ms 0.5 --period-ms 11.6
    python benchmarks/bench_host_tax.py --burner floor           # c1, Triton's own mechanics
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peer  # type: ignore[import-not-found]
from bench_gateway import MODEL_REF, REPO, process, wait_http  # type: ignore[import-not-found]
from bench_loadtest import tensor_block  # type: ignore[import-not-found]
from tritonforge import contract

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

# --- the Triton floor burner ---------------------------------------------------------------

_PY_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
{decoupled}{tensors}instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
parameters {{ key: "pace_ms", value: {{ string_value: "{pace_ms}" }} }}
"""

# One Python file for every floor model: what it does is chosen by its name. The engines send
# one response every pace_ms from a thread per request, the last one flagged final, as
# tritonforge's engine model does; preprocessing and postprocessing pass fixed tensors on.
_FLOOR_MODEL = '''
import json, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def t(name, value, dtype):
    return pb_utils.Tensor(name, np.array(value, dtype=dtype))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.kind = config["name"]
        self.pace = float(config["parameters"]["pace_ms"]["string_value"]) / 1000

    def execute(self, requests):
        if self.kind == "pre":
            return [pb_utils.InferenceResponse([
                t("input_ids", np.arange(40), np.int32),
                t("request_output_len", pb_utils.get_input_tensor_by_name(r, "max_tokens").as_numpy(), np.int32),
            ]) for r in requests]
        if self.kind == "post":
            return [pb_utils.InferenceResponse([t("text_output", [b" tok"], object),
                                                t("num_output_tokens", [1], np.int32)]) for r in requests]
        for r in requests:
            threading.Thread(target=self.stream, args=(r,), daemon=True).start()
        return None

    def stream(self, request):
        name = "request_output_len" if self.kind == "engine" else "max_tokens"
        n = int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])
        sender = request.get_response_sender()
        due = time.monotonic()
        for i in range(n):
            due += self.pace
            time.sleep(max(0.0, due - time.monotonic()))
            if self.kind == "engine":
                out = [t("output_ids", [100 + i], np.int32), t("sequence_length", [1], np.int32)]
            else:
                out = [t("text_output", [b" tok"], object), t("num_output_tokens", [1], np.int32)]
            sender.send(pb_utils.InferenceResponse(out), flags=FINAL if i == n - 1 else 0)
'''

_ENSEMBLE_CONFIG = """name: "floor"
platform: "ensemble"
max_batch_size: 0
{tensors}ensemble_scheduling {{ step [
  {{ model_name: "pre", model_version: -1,
    input_map {{ key: "text_input", value: "text_input" }}, input_map {{ key: "max_tokens", value: "max_tokens" }},
    output_map {{ key: "input_ids", value: "_ids" }}, output_map {{ key: "request_output_len", value: "_n" }} }},
  {{ model_name: "engine", model_version: -1,
    input_map {{ key: "input_ids", value: "_ids" }}, input_map {{ key: "request_output_len", value: "_n" }},
    output_map {{ key: "output_ids", value: "_out" }}, output_map {{ key: "sequence_length", value: "_len" }} }},
  {{ model_name: "post", model_version: -1,
    input_map {{ key: "output_ids", value: "_out" }}, input_map {{ key: "sequence_length", value: "_len" }},
    output_map {{ key: "text_output", value: "text_output" }},
    output_map {{ key: "num_output_tokens", value: "num_output_tokens" }} }}
] }}
"""


_CONTRACT = contract.by_name(contract.ENSEMBLE_INPUTS + contract.ENSEMBLE_OUTPUTS + contract.ENGINE_INPUTS
                             + contract.ENGINE_OUTPUTS)


def _floor(*specs: tuple[str, tuple[int, ...]]) -> tuple[contract.Tensor, ...]:
    """The contract's tensors (name, dtype) with the floor's own unbatched shapes, required."""
    return tuple(dataclasses.replace(_CONTRACT[name], dims=dims, optional=False) for name, dims in specs)


def _config_tensors(inputs: tuple[contract.Tensor, ...], outputs: tuple[contract.Tensor, ...]) -> str:
    return tensor_block("input", inputs) + tensor_block("output", outputs)


_TEXT_IN = _floor(("text_input", (1,)), ("max_tokens", (1,)))
_TEXT_OUT = _floor(("text_output", (-1,)), ("num_output_tokens", (-1,)))
_IDS = _floor(("input_ids", (-1,)), ("request_output_len", (1,)))
_OUT_IDS = _floor(("output_ids", (-1,)), ("sequence_length", (1,)))


def write_floor_repository(root: Path, pace_ms: float) -> None:
    """A Triton repository of the serving path's mechanics with no model in it: ``floor``, an
    ensemble ``pre`` -> decoupled ``engine`` -> ``post`` of Python models shaped like
    tritonforge's default (one engine response per token, each through postprocessing), and
    ``single``, one decoupled Python model streaming the same responses with no ensemble."""
    models = {"pre": (_TEXT_IN, _IDS, False), "engine": (_IDS, _OUT_IDS, True),
              "post": (_OUT_IDS, _TEXT_OUT, False), "single": (_TEXT_IN, _TEXT_OUT, True)}
    for name, (inputs, outputs, decoupled) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_FLOOR_MODEL)
        (root / name / "config.pbtxt").write_text(_PY_CONFIG.format(
            name=name, tensors=_config_tensors(inputs, outputs), pace_ms=pace_ms,
            decoupled="model_transaction_policy { decoupled: true }\n" if decoupled else ""))
    (root / "floor" / "1").mkdir(parents=True)
    (root / "floor" / "config.pbtxt").write_text(_ENSEMBLE_CONFIG.format(
        tensors=_config_tensors(_TEXT_IN, _TEXT_OUT)))


# The floor's client: streams generate_stream requests one after another over raw sockets
# (no SSE parsing: the least client work there is), and prints each request's event count.
_FLOOR_CLIENT = """
import json, socket, sys
host, port, model, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
body = json.dumps({"text_input": "hi", "max_tokens": n}).encode()
head = (f"POST /v2/models/{model}/generate_stream HTTP/1.1\\r\\nHost: {host}\\r\\n"
        f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\nConnection: close\\r\\n\\r\\n")
while True:
    s = socket.create_connection((host, port))
    s.sendall(head.encode() + body)
    events = 0
    while chunk := s.recv(65536):
        events += chunk.count(b"data:")
    s.close()
    print(events, flush=True)
"""


class _Burner:
    """One burner kind: ``busy`` (the busy loop) or a floor model streamed through Triton
    (``floor``: the ensemble; ``single``: one decoupled model), whose server stays up for the
    whole run (its idle cost is in the runs without the burner too)."""

    def __init__(self, kind: str, a: argparse.Namespace, tmp: Path) -> None:
        self.kind, self.a = kind, a
        self.server: Any = None
        self.proc: subprocess.Popen[bytes] | None = None
        if kind == "busy":
            return
        from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

        write_floor_repository(tmp / "floor-repository", a.pace_ms)
        self.server = TritonServer(ServerOptions(
            repository=tmp / "floor-repository", http_port=free_port(), grpc_port=free_port(),
            metrics_port=free_port(), front=True, log_file=tmp / "floor-tritonserver.log"))
        self.server.start_ready(timeout=300)

    def describe(self) -> str:
        if self.kind == "busy":
            share = self.a.burn_ms / self.a.period_ms
            return f"{self.a.burn_ms} ms busy every {self.a.period_ms} ms ({share:.1%} of one core)"
        what = "ensemble pre -> engine -> post" if self.kind == "floor" else "one decoupled model"
        return (f"Triton (with serve's HTTP front) streaming {self.a.output_len}-response requests one after "
                f"another from a no-op {what}, one response every {self.a.pace_ms} ms")

    def start(self) -> None:
        if self.kind == "busy":
            argv = [sys.executable, "-c", _BURNER, str(self.a.burn_ms), str(self.a.period_ms)]
        else:
            host, port = self.server.options.http_url.rsplit(":", 1)
            argv = [sys.executable, "-c", _FLOOR_CLIENT, host, port, self.kind, str(self.a.output_len)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE)

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far: (the server side, or the busy loop; the floor's client)."""
        assert self.proc is not None
        if self.kind == "busy":
            return bench_peer.host_cpu_s([self.proc.pid]), 0.0
        roots = [self.server.process.pid] + ([self.server.front.pid] if self.server.front else [])
        return bench_peer.host_cpu_s(roots), bench_peer.host_cpu_s([self.proc.pid])

    def stop(self) -> list[int]:
        """Stop the client; the event counts of the requests it completed."""
        assert self.proc is not None
        self.proc.kill()
        out, _ = self.proc.communicate()
        self.proc = None
        if self.kind != "busy":  # the engine streams the cut request to its end: let it, before
            time.sleep(self.a.output_len * self.a.pace_ms / 1000)  # a run without the burner
        return [int(x) for x in out.split()]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int, nargs="+", default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--burner", choices=("busy", "floor", "single"), default="busy",
                   help="busy: a busy loop; floor: Triton streaming from a no-op copy of the default "
                        "ensemble; single: the same from one decoupled model")
    p.add_argument("--burn-ms", type=float, default=1.0, help="busy: busy loop per slice (ms)")
    p.add_argument("--period-ms", type=float, default=11.6, help="busy: one slice every this many ms")
    p.add_argument("--pace-ms", type=float, default=None,
                   help="floor, single: one streamed response every this many ms (default: vllm serve's "
                        "own time per output token at c=1, measured before the runs)")
    p.add_argument("--per-stream", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--input-words", type=int, default=40)
    p.add_argument("--repository", type=Path, default=REPO)
    a = p.parse_args()
    if a.burner != "busy" and a.levels != [1]:
        p.error("--burner floor and single stream one request at a time, as the Triton path does at "
                "c=1 (from 4 streams the default spec coalesces responses): use --levels 1")

    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import free_port

    port = free_port()
    argv, env, flags = bench_peer.vllm_command("vllm-spec", resolve_model(MODEL_REF), "peer", port, a.repository)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "bench-host-tax-vllm.log"
    base = f"http://127.0.0.1:{port}"
    results: dict[tuple[int, bool], list[float]] = {}
    burn_per_tok: dict[int, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-tax-") as tmp, process(argv, env, log) as proc:
        wait_http(f"{base}/v1/models", 900, proc, log)
        asyncio.run(bench_peer.level("vllm-spec", base, "peer", bench_peer.prompts(4, a.input_words, seed=99),
                                     2, a.output_len))  # warm-up
        if a.burner != "busy" and a.pace_ms is None:  # one response per token the engine makes
            r = asyncio.run(bench_peer.level("vllm-spec", base, "peer",
                                             bench_peer.prompts(a.min_requests, a.input_words, seed=98), 1,
                                             a.output_len))
            a.pace_ms = round(1000 / r.tok_s, 1)
            print(f"calibration: vllm serve alone c=1 {r.tok_s:.1f} tok/s -> one floor response every "
                  f"{a.pace_ms} ms", flush=True)
        burner = _Burner(a.burner, a, Path(tmp))
        print(f"vllm serve {' '.join(flags)}\nburner: {burner.describe()}; "
              f"{os.cpu_count()} CPUs", flush=True)
        try:
            for rep in range(a.repeats):
                for burning in ((False, True) if rep % 2 == 0 else (True, False)):
                    for c in a.levels:
                        results.setdefault((c, burning), []).append(
                            _run(a, base, c, rep, burner if burning else None, burn_per_tok))
        finally:
            burner.close()
    print("\nmedians of repeats (tok/s): without / with the burner, ratio, burner CPU per output token"
          + ("" if a.burner == "busy" else " (server side + its client)"))
    for c in a.levels:
        off, on = statistics.median(results[(c, False)]), statistics.median(results[(c, True)])
        side = statistics.median(x for x, _ in burn_per_tok[c])
        client = statistics.median(y for _, y in burn_per_tok[c])
        # A repeat's two runs of a level are close in time (ABBA): their ratio is spared most drift.
        pairs = statistics.median(x / y for x, y in zip(results[(c, True)], results[(c, False)]))
        print(f"  c={c:<3} {off:7.1f} / {on:7.1f}  ratio {on / off:.3f} (median of each repeat's ratio "
              f"{pairs:.3f})  burner {side:.3f}" + ("" if a.burner == "busy" else f" + {client:.3f}") + " ms/tok")
    return 0


def _run(a: argparse.Namespace, base: str, c: int, rep: int, burner: _Burner | None,
         burn_per_tok: dict[int, list[tuple[float, float]]]) -> float:
    """One measured level of ``vllm serve``, with the burner running or not; its tok/s."""
    texts = bench_peer.prompts(max(a.min_requests, c * a.per_stream), a.input_words, seed=c + rep)
    if burner is None:
        r = asyncio.run(bench_peer.level("vllm-spec", base, "peer", texts, c, a.output_len))
        print(f"burner off c={c:<3} {r.tok_s:7.1f} tok/s  {r.tokens} tokens  TTFT p50 {r.ttft(0.5):5.0f} ms  "
              f"load {r.load_1m:.2f}", flush=True)
        return r.tok_s
    burner.start()
    try:
        time.sleep(0.5)
        before = burner.cpu_s()
        r = asyncio.run(bench_peer.level("vllm-spec", base, "peer", texts, c, a.output_len))
        after = burner.cpu_s()
    finally:
        events = burner.stop()
    side, client = ((y - x) / r.tokens * 1000 for x, y in zip(before, after))
    if burner.kind != "busy" and (not events or any(n != a.output_len for n in events)):
        raise SystemExit(f"the floor's requests streamed {sorted(set(events))} responses, not {a.output_len}")
    burn_per_tok.setdefault(c, []).append((side, client))
    print(f"burner on  c={c:<3} {r.tok_s:7.1f} tok/s  {r.tokens} tokens  TTFT p50 {r.ttft(0.5):5.0f} ms  "
          f"load {r.load_1m:.2f}  burner {side:.3f}"
          + ("" if burner.kind == "busy" else f" + client {client:.3f} ({len(events)} requests)")
          + " ms/tok", flush=True)
    return r.tok_s


if __name__ == "__main__":
    sys.exit(main())
