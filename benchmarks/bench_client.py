"""Typed client vs raw tritonclient: streaming wall time on the same workload.

Both sides stream N requests over gRPC with C in flight at a time (C worker threads) and
read every response to the end:

* typed: one ``tritonforge.clients.Client`` shared by all workers (``client.stream``);
* raw: tritonclient's own streaming API, one ``InferenceServerClient`` per worker
  (``start_stream`` + ``async_stream_infer`` with empty final responses, numpy inputs),
  the end of each request detected by the ``triton_final_response`` parameter.

Runs alternate (typed, raw, raw, typed, ...) after a warm-up; the best wall time of each
is compared. Prints both and the ratio typed/raw (goal <= 1.05).

    python benchmarks/bench_client.py --url 127.0.0.1:8001 --streams 32 --concurrency 8
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
from tritonforge import contract
from tritonforge.clients import Client, TritonForgeError

PROMPT = "Once upon a time, there was a little"


def run_typed(client: Client, n: int, c: int, max_tokens: int, texts: list[str]) -> None:
    def one() -> None:
        with client.stream(PROMPT, max_tokens=max_tokens, temperature=0.0) as s:
            texts.append("".join(ch.text for ch in s))

    _workers(one, n, c)


def _raw_inputs(max_tokens: int) -> list[Any]:
    tensors = contract.by_name(contract.ENSEMBLE_INPUTS)
    values = {
        "text_input": np.array([[PROMPT.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "temperature": np.array([[0.0]], dtype=np.float32),
        "stream": np.array([[True]], dtype=bool),
    }
    out = []
    for name, array in values.items():
        inp = grpcclient.InferInput(name, list(array.shape), tensors[name].dtype.wire)
        inp.set_data_from_numpy(array)
        out.append(inp)
    return out


def run_raw(url: str, model: str, n: int, c: int, max_tokens: int, texts: list[str]) -> None:
    local = threading.local()
    text_output = contract.by_name(contract.ENSEMBLE_OUTPUTS)["text_output"].name

    def one() -> None:
        if not hasattr(local, "client"):
            q: queue.Queue[tuple[Any, Any]] = queue.Queue()
            local.q = q  # the callback runs on tritonclient's helper thread: bind q itself
            local.client = grpcclient.InferenceServerClient(url)
            local.client.start_stream(callback=lambda result, error: q.put((result, error)))
        local.client.async_stream_infer(model, _raw_inputs(max_tokens), enable_empty_final_response=True)
        parts: list[str] = []
        while True:
            result, error = local.q.get(timeout=300)
            if error is not None:
                raise RuntimeError(str(error))
            response = result.get_response()
            out = result.as_numpy(text_output)
            if out is not None:
                parts.extend(x.decode() if isinstance(x, bytes) else str(x) for x in out.reshape(-1))
            if response.parameters[contract.FINAL_RESPONSE_PARAMETER].bool_param:
                break
        texts.append("".join(parts))

    clients: list[Any] = []

    def one_tracked() -> None:
        one()
        if local.client not in clients:
            clients.append(local.client)

    try:
        _workers(one_tracked, n, c)
    finally:
        for cl in clients:
            cl.stop_stream()
            cl.close()


def _workers(fn: Callable[[], None], n: int, c: int) -> None:
    """Run ``fn`` n times on c threads; re-raise the first failure."""
    counter = iter(range(n))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        while not errors:
            with lock:
                if next(counter, None) is None:
                    return
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8001", help="gRPC HOST:PORT of the server")
    ap.add_argument("--model", default=None, help="ensemble name (default: discovered)")
    ap.add_argument("--streams", "-n", type=int, default=32, help="requests per run")
    ap.add_argument("--concurrency", "-c", type=int, default=8, help="requests in flight")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each side")
    args = ap.parse_args(argv)

    try:
        client = Client(args.url, model=args.model)
        model = args.model or (client.ready() and client.model)
        if not model:
            print(f"error: model not ready at {args.url}", file=sys.stderr)
            return 1
        # Warm-up (connections, engine caches) for both sides.
        run_typed(client, args.concurrency, args.concurrency, args.max_tokens, [])
        run_raw(args.url, model, args.concurrency, args.concurrency, args.max_tokens, [])
        typed_best = raw_best = float("inf")
        typed_texts: list[str] = []
        raw_texts: list[str] = []
        for i in range(args.repeats):
            # Alternate which side goes first, so drifting server load favours neither.
            for side in (("typed", "raw") if i % 2 == 0 else ("raw", "typed")):
                t0 = time.perf_counter()
                if side == "typed":
                    run_typed(client, args.streams, args.concurrency, args.max_tokens, typed_texts)
                    typed_best = min(typed_best, time.perf_counter() - t0)
                else:
                    run_raw(args.url, model, args.streams, args.concurrency, args.max_tokens, raw_texts)
                    raw_best = min(raw_best, time.perf_counter() - t0)
        client.close()
    except TritonForgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    same = set(typed_texts) == set(raw_texts) and len(set(typed_texts)) == 1
    ratio = typed_best / raw_best
    print(f"model {model}: {args.streams} streams x {args.max_tokens} tokens, concurrency {args.concurrency}, "
          f"best of {args.repeats}")
    print(f"typed client (tritonforge.clients.Client): {typed_best:8.3f} s")
    print(f"raw tritonclient (start_stream):            {raw_best:8.3f} s")
    print(f"ratio typed/raw: {ratio:.3f}  (goal <= 1.05){'' if ratio <= 1.05 else '  ABOVE GOAL'}")
    print(f"identical greedy text on both sides: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
