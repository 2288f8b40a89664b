"""vLLM engine knobs proven on the real CPU server, one server for every compatible knob.

The spec is ``deployments/default.yaml`` plus prefix caching, chunked prefill with a
128-token step budget, ``max_num_seqs: 4`` with ``max_queue_size: 2``, n-gram
speculative decoding and a LoRA adapter, on the packaged ``.gguf`` file as ``model.path``
(``quantization: gguf``); ``tritonforge serve SPEC`` renders and serves it on free ports. Each test asserts the knob's effect by an oracle the code under test does not compute:

* prefix caching: vLLM's own prefix-cache hit count (its scheduler stats, exported as
  ``tritonforge_engine_prefix_cache_*``) rises, and the client's TTFT of prompts sharing a
  long prefix falls against prompts of the same length that share nothing (medians);
* chunked prefill: inter-token gaps of streams that are decoding, measured by the client,
  stay a fraction of a 1,500-token prefill's time on this server; on the shared default
  server (2,048-token steps: the prompt is one step) the same streams stall for the whole
  prefill;
* ``max_queue_size``: vLLM's own scheduler report shows 4 running + 2 waiting, and the next
  request is refused at once (typed ``Overloaded`` on a stream, gRPC UNAVAILABLE from ``_sync``); the refusal counter
  counts them;
* n-gram speculation: greedy text equals vLLM's offline output without speculation
  (``tests/vllm_oracle.py``), and vLLM's own drafted/accepted counts rise;
* LoRA: an adapter made here (PEFT layout, seeded random weights) is served by name; its
  greedy text differs from the base model's and equals offline vLLM's with the same
  ``LoRARequest``; an unknown adapter name is refused (INVALID_ARG). The engine loads the
  spec's adapters at start (``add_lora``);
* GGUF: the engine starts on the ``.gguf`` path (vLLM 0.32 has no GGUF method, so nothing is
  passed for it) and every text above is offline vLLM's on the dequantized folder.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from conftest import default_engine_args, serve_spec
from conftest import metric as scrape
from tritonforge.clients import AsyncClient, Client, Overloaded

ROOT = Path(__file__).resolve().parents[1]
TRITONFORGE = str(Path(sys.executable).parent / "tritonforge")
MODEL = "knobs"
MAX_NUM_SEQS, MAX_QUEUE, STEP_TOKENS = 4, 2, 128
LORA_NAME, LORA_RANK = "story", 8

pytestmark = pytest.mark.server

_WORDS = ("river", "stone", "lamp", "orange", "window", "garden", "silver", "cloud", "paper",
          "engine", "forest", "candle", "bridge", "winter", "copper", "valley", "needle",
          "harbor", "pepper", "violet", "ladder", "marble", "thunder", "pocket", "meadow")


def _words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def metric(metrics_url: str, name: str, model: str = "vllm_engine") -> float:
    return scrape(metrics_url, name, required=True, model=model)


def _wait_metric(metrics_url: str, name: str, want: float | None = None, *, old: float | None = None,
                 seconds: float = 30) -> float:
    """The metric once it equals ``want`` (or differs from ``old``), or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        v = metric(metrics_url, name)
        if (v == want if want is not None else v != old) or time.monotonic() > deadline:
            return v
        time.sleep(0.1)


def lora_adapter() -> Path:
    """A LoRA adapter for SmolLM2 in the PEFT layout: seeded random rank-8 weights on q_proj
    and v_proj of every layer, made here once (kept in the project cache)."""
    import torch
    from safetensors.torch import save_file
    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir

    folder = cache_dir() / "test-lora" / f"smollm2-qv-r{LORA_RANK}-seed1"
    if (folder / "adapter_config.json").is_file():
        return folder
    base = resolve_model("package:smollm2-135m-instruct")
    cfg = json.loads((base / "config.json").read_text())
    hidden = cfg["hidden_size"]
    kv = cfg["num_key_value_heads"] * (hidden // cfg["num_attention_heads"])
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for module, out in (("q_proj", hidden), ("v_proj", kv)):
            key = f"base_model.model.model.layers.{i}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(LORA_RANK, hidden, generator=gen) * 0.05
                                               ).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out, LORA_RANK, generator=gen) * 0.05
                                               ).to(torch.bfloat16)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "adapter_model.safetensors"))
    (tmp / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": 16,
        "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": str(base)}))
    tmp.rename(folder)
    return folder


def knob_spec() -> dict[str, Any]:
    """The default spec with every knob these tests prove turned on."""
    from tritonforge.runtime.models import _packaged_file

    spec = yaml.safe_load((ROOT / "deployments" / "default.yaml").read_text())
    spec["name"] = MODEL
    # The packaged model's GGUF file itself: served dequantized (vLLM 0.32 has no GGUF method).
    spec["model"] = {**spec["model"], "path": str(_packaged_file("package:smollm2-135m-instruct"))}
    spec["quantization"] = "gguf"
    spec["batching"] = {"max_num_seqs": MAX_NUM_SEQS, "max_queue_size": MAX_QUEUE,
                        "chunked_prefill": True, "max_num_batched_tokens": STEP_TOKENS}
    spec["kv_cache"] = {**spec["kv_cache"], "prefix_caching": True}
    spec["speculative"] = {"method": "ngram", "num_speculative_tokens": 4}
    spec["lora"] = {"enabled": True, "max_rank": LORA_RANK, "max_adapters": 2,
                    "adapters": {LORA_NAME: str(lora_adapter())}}
    return dict(spec)


@pytest.fixture(scope="module")
def lora_oracle() -> Iterator[Any]:
    """Offline vLLM with LoRA enabled (the reference for the adapter's output)."""
    from conftest import start_oracle

    oracle = start_oracle({"enable_lora": True, "max_lora_rank": LORA_RANK})
    try:
        yield oracle
    finally:
        oracle.close()


@pytest.fixture(scope="module")
def knob_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``tritonforge serve`` on ``knob_spec()``; TRITONFORGE_TEST_KNOBS_SERVER="http=H:P,
    grpc=H:P,metrics=H:P" reuses one already serving it (handy while developing)."""
    reuse = os.environ.get("TRITONFORGE_TEST_KNOBS_SERVER")
    if reuse:
        yield dict(p.split("=", 1) for p in reuse.split(","))
        return
    with serve_spec(knob_spec(), tmp_path_factory.mktemp("vllm-knobs"), "knobs") as addresses:
        yield addresses


# -- LoRA by name from the typed client and the gateway (next to the knob itself below) ----
def test_lora_adapter_by_name_from_the_typed_client_and_the_gateway(knob_server: dict[str, Any],
                                                                   lora_oracle: Any) -> None:
    """``Request(lora=...)``, and in the gateway the adapter's own model id or
    ``<model>:<adapter>`` (listed by /v1/models with the served model as parent, as vLLM's
    server lists adapters), give the adapter's output, equal to offline vLLM's."""
    import openai
    from tritonforge.clients import Request
    from tritonforge.gateway import run_gateway_in_thread

    prompt = "Once upon a time, there was a little"
    offline = lora_oracle.generate(prompt, lora=(LORA_NAME, 1, str(lora_adapter())),
                                   max_tokens=16, temperature=0.0)["text"]
    with Client(knob_server["grpc"], model=MODEL) as client:
        assert client.lora_adapters() == [LORA_NAME]
        assert client.complete(Request(prompt=prompt, max_tokens=16, temperature=0.0, lora=LORA_NAME)).text == offline
        base = client.complete(Request(prompt=prompt, max_tokens=16, temperature=0.0)).text
    assert base != offline
    with run_gateway_in_thread(knob_server["grpc"], MODEL) as gw, \
            openai.OpenAI(base_url=gw.url, api_key="unused", max_retries=0, timeout=300) as sdk:
        cards = {m.id: m for m in sdk.models.list()}
        assert set(cards) == {MODEL, LORA_NAME} and cards[LORA_NAME].parent == MODEL  # type: ignore[attr-defined]
        for name in (LORA_NAME, f"{MODEL}:{LORA_NAME}"):
            reply = sdk.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0)
            assert reply.choices[0].text == offline and reply.model == name
        assert sdk.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text == base
        with pytest.raises(openai.NotFoundError) as err:
            sdk.completions.create(model=f"{MODEL}:nope", prompt=prompt, max_tokens=4)
        assert LORA_NAME in str(err.value)


# -- prefix caching -------------------------------------------------------------------------
def test_prefix_cache_hits_rise_and_ttft_falls(knob_server: dict[str, Any]) -> None:
    m = knob_server["metrics"]
    run = time.time_ns()  # prompts no earlier run left in the cache
    shared = _words(run, 900)
    with Client(knob_server["grpc"], model=MODEL) as client:
        client.complete(_words(run - 1, 40), max_tokens=1)  # warm-up, not measured
        client.complete(shared + " Question 0.", max_tokens=1)  # fills the cache
        q0, h0 = metric(m, "tritonforge_engine_prefix_cache_queries_total"), metric(
            m, "tritonforge_engine_prefix_cache_hits_total")
        miss, hit, hit_tokens = [], [], []
        for i in range(1, 6):
            # Same length, nothing shared: a new first word breaks every block's hash.
            cold = client.complete(_words(run + i, 900) + f" Question {i}.", max_tokens=1)
            h_before = metric(m, "tritonforge_engine_prefix_cache_hits_total")
            warm = client.complete(shared + f" Question {i}.", max_tokens=1)
            hit_tokens.append(_wait_metric(m, "tritonforge_engine_prefix_cache_hits_total",
                                           old=h_before, seconds=10) - h_before)
            assert cold.ttft is not None and warm.ttft is not None
            miss.append(cold.ttft)
            hit.append(warm.ttft)
        prompt_tokens = warm.prompt_tokens
    queries = metric(m, "tritonforge_engine_prefix_cache_queries_total") - q0
    hits = metric(m, "tritonforge_engine_prefix_cache_hits_total") - h0
    print(f"\nprefix caching: {prompt_tokens}-token prompts, TTFT median miss "
          f"{statistics.median(miss) * 1000:.0f} ms ({[round(x * 1000) for x in miss]}), hit "
          f"{statistics.median(hit) * 1000:.0f} ms ({[round(x * 1000) for x in hit]}); vLLM's "
          f"prefix cache: {hits:.0f} of {queries:.0f} queried tokens hit, {hit_tokens} per hit")
    # vLLM queried every prompt token of the ten requests and hit whole blocks of the shared
    # prefix for each warm request only (CPU block size 128).
    assert queries >= 10 * (prompt_tokens - 8)
    assert all(t >= prompt_tokens - 128 - 16 for t in hit_tokens), hit_tokens
    assert hits == sum(hit_tokens)
    assert statistics.median(hit) < 0.6 * statistics.median(miss), (hit, miss)


# -- chunked prefill ------------------------------------------------------------------------
async def _gaps_during_long_prefill(grpc_url: str, model: str) -> dict[str, Any]:
    """Two streams decode; a 1,500-token prompt arrives. The streams' largest inter-chunk gap
    while it is prefilled, their typical gap before it, and the long prompt's TTFT."""
    arrivals: list[list[float]] = [[], []]
    async with AsyncClient(grpc_url, model=model) as client:
        async def run(i: int) -> None:
            async with client.stream(f"Write a long story about a {_WORDS[i]}.", max_tokens=400,
                                     min_tokens=400) as s:
                async for chunk in s:
                    if chunk.text:
                        arrivals[i].append(time.monotonic())
                    if len(arrivals[i]) > 0 and done.is_set():
                        break

        done = asyncio.Event()
        tasks = [asyncio.create_task(run(i)) for i in range(2)]
        while min(len(a) for a in arrivals) < 12:
            await asyncio.sleep(0.05)
        sent = time.monotonic()
        # A prompt no cache holds (a prefix-cache hit would skip the prefill).
        long = await client.complete(_words(time.time_ns(), 1500), max_tokens=1)
        finished = time.monotonic()
        await asyncio.sleep(1.0)
        done.set()
        await asyncio.gather(*tasks)
    during, before = [], []
    for a in arrivals:
        for prev, nxt in itertools.pairwise(a):
            if nxt > sent and prev < finished:
                during.append(nxt - prev)
            elif nxt <= sent:
                before.append(nxt - prev)
    assert long.ttft is not None
    return {"max_gap": max(during), "typical_gap": statistics.quantiles(before, n=10)[-1],
            "ttft": long.ttft, "prompt_tokens": long.prompt_tokens}


def test_chunked_prefill_keeps_running_streams_flowing(knob_server: dict[str, Any]) -> None:
    r = asyncio.run(_gaps_during_long_prefill(knob_server["grpc"], MODEL))
    print(f"\nchunked prefill on ({STEP_TOKENS}-token steps): {r['prompt_tokens']}-token prompt "
          f"prefilled in {r['ttft']:.2f} s; running streams' largest gap {r['max_gap']:.2f} s "
          f"(p90 before it {r['typical_gap'] * 1000:.0f} ms)")
    assert r["prompt_tokens"] >= 1400
    # The prefill took at least ceil(1400 / 128) = 11 steps; every one of them also decoded
    # the running streams.
    assert r["max_gap"] < 0.5 * r["ttft"], r


def test_with_a_step_budget_over_the_prompt_running_streams_stall(triton_server: Any) -> None:
    """The shared default server (vLLM's own CPU defaults: 2,048-token steps): the whole
    1,500-token prompt fits one step, so it is prefilled in one step and the running streams
    wait for it -- the contrast that shows the knob server's 128-token steps at work."""
    budget = default_engine_args()["max_num_batched_tokens"]
    r = asyncio.run(_gaps_during_long_prefill(triton_server.grpc_url, triton_server.model))
    assert r["prompt_tokens"] <= budget  # type: ignore[operator]
    print(f"\n{budget}-token steps: {r['prompt_tokens']}-token prompt prefilled in "
          f"{r['ttft']:.2f} s; running streams' largest gap {r['max_gap']:.2f} s (p90 "
          f"before it {r['typical_gap'] * 1000:.0f} ms)")
    assert r["prompt_tokens"] >= 1400
    assert r["max_gap"] > 0.6 * r["ttft"], r


# -- max_queue_size ---------------------------------------------------------------------------
def _model_infer(grpc_url: str, model: str, prompt: str) -> tuple[grpc.StatusCode, str]:
    """One raw gRPC ModelInfer (text_input, max_tokens 8): its status code and details."""
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    msg = pb.ModelInferRequest(model_name=model, id="one-more")
    text = prompt.encode()
    for name, datatype, raw in (("text_input", "BYTES", struct.pack("<I", len(text)) + text),
                                ("max_tokens", "INT32", struct.pack("<i", 8))):
        msg.inputs.append(pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[1, 1]))
        msg.raw_input_contents.append(raw)
    with grpc.insecure_channel(grpc_url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(msg, timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), str(exc.details())
    return grpc.StatusCode.OK, ""


async def _fill_and_overflow(srv: dict[str, Any]) -> dict[str, Any]:
    m = srv["metrics"]
    rejected0 = metric(m, "tritonforge_engine_queue_full_rejections_total")
    async with AsyncClient(srv["grpc"], model=MODEL) as client:
        first: dict[int, asyncio.Event] = {i: asyncio.Event() for i in range(MAX_NUM_SEQS + MAX_QUEUE)}
        stop = asyncio.Event()

        async def hold(i: int) -> None:
            async with client.stream(f"Story {i}: once upon a time", max_tokens=1500,
                                     min_tokens=1500) as s:
                async for chunk in s:
                    if chunk.text:
                        first[i].set()
                    if stop.is_set():
                        break

        tasks = [asyncio.create_task(hold(i)) for i in range(MAX_NUM_SEQS)]
        await asyncio.wait_for(asyncio.gather(*(first[i].wait() for i in range(MAX_NUM_SEQS))), 120)
        tasks += [asyncio.create_task(hold(i)) for i in range(MAX_NUM_SEQS, MAX_NUM_SEQS + MAX_QUEUE)]
        deadline = time.monotonic() + 30
        while True:  # vLLM's own scheduler report: 4 running, 2 waiting
            running = metric(m, "tritonforge_engine_requests_running")
            waiting = metric(m, "tritonforge_engine_requests_waiting")
            if (running, waiting) == (MAX_NUM_SEQS, MAX_QUEUE) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(Overloaded) as refused:
            async with AsyncClient(srv["grpc"], model=MODEL, connect_retries=0) as once, \
                    once.stream("One more story", max_tokens=8) as s:
                async for _ in s:
                    pass
        stream_refusal = time.monotonic() - t0
        t0 = time.monotonic()
        code, details = await asyncio.to_thread(_model_infer, srv["grpc"], f"{MODEL}_sync", "One more")
        unary_refusal = time.monotonic() - t0
        rejected = _wait_metric(m, "tritonforge_engine_queue_full_rejections_total", rejected0 + 2)
        still_waiting = metric(m, "tritonforge_engine_requests_waiting")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return {"running": running, "waiting": waiting, "still_waiting": still_waiting,
            "stream_error": str(refused.value), "stream_s": stream_refusal,
            "unary_code": code, "unary_details": details, "unary_s": unary_refusal,
            "rejected": rejected - rejected0}


def test_queue_full_is_refused_at_once_and_counted(knob_server: dict[str, Any]) -> None:
    r = asyncio.run(_fill_and_overflow(knob_server))
    print(f"\nmax_queue_size: vLLM reported {r['running']:.0f} running + {r['waiting']:.0f} "
          f"waiting; next stream refused in {r['stream_s'] * 1000:.0f} ms ({r['stream_error']!r}), "
          f"_sync ModelInfer refused in {r['unary_s'] * 1000:.0f} ms with {r['unary_code'].name}; "
          f"refusals counted {r['rejected']:.0f}")
    assert (r["running"], r["waiting"]) == (MAX_NUM_SEQS, MAX_QUEUE)
    assert "queue is full" in r["stream_error"] and r["stream_s"] < 2.0
    assert r["unary_code"] is grpc.StatusCode.UNAVAILABLE and "queue is full" in r["unary_details"]
    assert r["unary_s"] < 2.0
    assert r["rejected"] == 2
    assert r["still_waiting"] == MAX_QUEUE  # the refused requests never reached vLLM


# -- n-gram speculative decoding --------------------------------------------------------------
SPEC_PROMPTS = (
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
    "Once upon a time, there was a little",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The",
)


def test_ngram_speculation_keeps_greedy_output_and_accepts_drafts(
    knob_server: dict[str, Any], vllm_oracle_eager: Any,
) -> None:
    m = knob_server["metrics"]
    names = ("drafts", "draft_tokens", "accepted_tokens")
    before = {n: metric(m, f"tritonforge_engine_spec_decode_{n}_total") for n in names}
    served_s = offline_s = 0.0
    with Client(knob_server["grpc"], model=MODEL) as client:
        for prompt in SPEC_PROMPTS:
            t0 = time.monotonic()
            served = client.complete(prompt, max_tokens=32, temperature=0.0)
            t1 = time.monotonic()
            offline = vllm_oracle_eager.generate(prompt, max_tokens=32, temperature=0.0)
            served_s, offline_s = served_s + t1 - t0, offline_s + time.monotonic() - t1
            assert served.text == offline["text"], (prompt, served.text, offline["text"])
    time.sleep(0.5)
    got = {n: metric(m, f"tritonforge_engine_spec_decode_{n}_total") - before[n] for n in names}
    print(f"\nngram speculation (4 tokens): {len(SPEC_PROMPTS)} prompts = vLLM offline without "
          f"speculation; vLLM's counts: {got['drafts']:.0f} drafts, {got['draft_tokens']:.0f} "
          f"drafted, {got['accepted_tokens']:.0f} accepted "
          f"({got['accepted_tokens'] / max(1.0, got['draft_tokens']):.0%}); served in {served_s:.1f} s, "
          f"offline {offline_s:.1f} s")
    assert got["drafts"] > 0 and got["draft_tokens"] >= got["drafts"]
    assert 0 < got["accepted_tokens"] <= got["draft_tokens"]


# -- LoRA -------------------------------------------------------------------------------------
def _sync_generate(http: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://{http}/v2/models/{MODEL}_sync/generate", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_lora_adapter_is_served_by_name(knob_server: dict[str, Any], lora_oracle: Any) -> None:
    prompt = "Once upon a time, there was a little"
    body = {"text_input": prompt, "max_tokens": 16, "temperature": 0.0}
    status, base = _sync_generate(knob_server["http"], body)
    assert status == 200, base
    status, adapted = _sync_generate(knob_server["http"], {**body, "lora_name": LORA_NAME})
    assert status == 200, adapted
    offline = lora_oracle.generate(prompt, lora=(LORA_NAME, 1, str(lora_adapter())),
                                   max_tokens=16, temperature=0.0)
    status, unknown = _sync_generate(knob_server["http"], {**body, "lora_name": "nope"})
    print(f"\nLoRA {LORA_NAME!r} (rank {LORA_RANK}, seeded random): {adapted['text_output']!r} "
          f"(base: {base['text_output']!r}); unknown adapter: HTTP {status} {unknown.get('error')!r}")
    assert adapted["text_output"] == offline["text"]
    assert adapted["text_output"] != base["text_output"]  # (base = offline: the ngram test)
    assert status == 400 and "lora_name 'nope'" in unknown.get("error", ""), unknown


def test_gguf_model_path_is_served_without_a_quantization_argument(
    knob_server: dict[str, Any], tmp_path: Path,
) -> None:
    """The server above started on the .gguf path; what its engine was given (no quantization)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    spec = tmp_path / "knobs.yaml"
    spec.write_text(yaml.safe_dump(knob_spec()))
    subprocess.run([TRITONFORGE, "generate", str(spec), "--output", str(tmp_path / "repo")],
                   check=True, capture_output=True, timeout=120)
    config = text_format.Parse((tmp_path / "repo" / "vllm_engine" / "config.pbtxt").read_text(),
                               mc.ModelConfig())
    args = json.loads(config.parameters["tritonforge_engine_args"].string_value)
    assert "quantization" not in args, args
