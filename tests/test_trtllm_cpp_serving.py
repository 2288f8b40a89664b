"""The TensorRT-LLM C++ path's ensemble on the real tritonserver (issue 12), with its engine
step swapped for tritonforge's CPU engine model answering as the C++ backend does
(``tritonforge_engine_kind: trtllm_cpp``: every token streamed, stop words returned, end_id
left out, no finish reason reaching postprocessing -- the ensemble of the C++ path maps only
the backend's ``output_ids``, ``sequence_length``, ``output_log_probs`` and
``sequence_index``). That stand-in reads and answers the backend's own tensor names (the
contract is checked against upstream's template in ``tests/test_trtllm_facts.py``; see
``EngineRunner`` for the upstream files its behaviour follows) and generates with real vLLM
on this CPU. The repository is what
``deployments/llama3-8b-trtllm-fp8.yaml`` renders, but for the engine step, the tokenizer
(SmolLM2 here) and preprocessing's instance count (1 on this 2-core machine).

- streams end with the right finish reason, derived by postprocessing: ``length``, ``stop`` at
  a stop word (which is not returned), ``stop`` at end of sequence -- with vLLM's own text;
- a cancelled stream is answered ``cancelled`` (postprocessing's own count on /metrics) and
  stops the engine;
- structured outputs, two sequences and log-probabilities (issue 15): a json_schema guide
  holds for 20 of 20 samples at temperature 1 (the jsonschema validator) where unguided ones
  mostly fail, n=2 with a seed and greedy log-probabilities equal vLLM offline, top_logprobs
  is refused naming it, and a cancelled request of three sequences leaves no state;
- after 1,000 finished requests postprocessing holds no state: 16 request ids each reused
  for one request after another, every request gives vLLM's offline text and its own finish
  reason (a state left by the previous request of its id would hand it that request's stop
  words, budget and tokens), the facts folder on disk is empty, and its gauges read 0.
"""

from __future__ import annotations

import asyncio
import queue
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import chat_prompt_ids, wait_engine_gauge
from tritonforge import contract as C
from tritonforge.clients import AsyncClient, Client, InvalidRequest, Request
from tritonforge.triton_models import metrics
from tritonforge.triton_models.request_facts import FactsStore
from trtllm_support import (
    MODEL_REF,
    load_example,
    metric,
    set_param,
    start,
    wait_metric,
    write_repo,
)

SPEC = "llama3-8b-trtllm-fp8"
STORY = "Once upon a time, there was a little"
POST_OPEN = metrics.POST_OPEN_REQUESTS
POST_FACTS = metrics.POST_REQUEST_FACTS
POST_FINISHED = metrics.POST_FINISHED
REQUESTS = 1000


def _swap_engine(trt: Path, cpu: Path) -> None:
    """The C++ backend's model -> tritonforge's engine model under the same name, answering
    as the C++ backend; pre/postprocessing on this machine's tokenizer."""
    name = C.MODEL_TENSORRT_LLM
    shutil.rmtree(trt / name)
    shutil.copytree(cpu / C.MODEL_VLLM_ENGINE, trt / name)
    cfg = trt / name / "config.pbtxt"
    batch = re.search(r"max_batch_size: (\d+)", (trt / C.MODEL_PREPROCESSING / "config.pbtxt").read_text())
    assert batch is not None
    text = cfg.read_text().replace(f'name: "{C.MODEL_VLLM_ENGINE}"', f'name: "{name}"')
    cfg.write_text(re.sub(r"max_batch_size: \d+", f"max_batch_size: {batch.group(1)}", text))
    set_param(cfg, C.Param.ENGINE_KIND.value, C.EngineKind.TRTLLM_CPP.value)
    for model in (C.MODEL_PREPROCESSING, C.MODEL_POSTPROCESSING):
        path = trt / model / "config.pbtxt"
        set_param(path, C.Param.MODEL.value, MODEL_REF)
        set_param(path, C.Param.TOKENIZER.value, MODEL_REF)
    pre = trt / C.MODEL_PREPROCESSING / "config.pbtxt"
    pre.write_text(re.sub(r"count: \d+", "count: 1", pre.read_text()))


@pytest.fixture(scope="module")
def cpp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tritonforge.render.validate import validate_repository

    tmp = tmp_path_factory.mktemp("trtllm-cpp")
    data = load_example(SPEC)
    trt = write_repo(data, tmp / "trt")
    cpu = write_repo(load_example("default"), tmp / "cpu")
    ensemble_before = (trt / data["name"] / "config.pbtxt").read_text()
    _swap_engine(trt, cpu)
    assert (trt / data["name"] / "config.pbtxt").read_text() == ensemble_before  # same wiring
    assert validate_repository(trt) == []
    server, handle = start(trt, log_name="trtllm-cpp")
    handle.model = data["name"]
    try:
        yield handle
    finally:
        server.stop()


def _no_state(handle: Any) -> None:
    assert wait_metric(handle.metrics_url, POST_OPEN, lambda v: v == 0) == 0
    assert wait_metric(handle.metrics_url, POST_FACTS, lambda v: v == 0) == 0
    assert FactsStore.for_model(handle.repo / C.MODEL_POSTPROCESSING).count() == 0


def test_streams_end_with_the_right_finish_reason(cpp: Any, vllm_oracle: Any) -> None:
    from tritonforge.triton_models.detokenize import make_decoder
    from tritonforge.triton_models.preprocess import load_tokenizer

    tok = load_tokenizer(MODEL_REF)
    decode = make_decoder(tok)
    ref12 = vllm_oracle.generate(STORY, temperature=0, max_tokens=12)["text"]
    ref = vllm_oracle.generate(STORY, temperature=0, max_tokens=24)
    ids = ref["token_ids"]
    # a one-token stop word that the greedy text reaches a few tokens in
    at = next(i for i in range(3, len(ids)) if tok.encode(tok.decode([ids[i]]), add_special_tokens=False) == [ids[i]]
              and tok.decode([ids[i]]).strip())
    stop_word = tok.decode([ids[at]])
    # a question whose greedy answer ends at end of sequence within 64 tokens: which one does
    # depends on the CPU's bf16 kernels (on an AMX machine "What is the capital of France?"
    # loops to the budget), so the oracle picks it from a few
    for question in ("What is the capital of France?", "What is the capital of Italy?", "What is 2 + 2?"):
        chat = [{"role": "user", "content": question}]
        chat_ref = vllm_oracle.generate(chat_prompt_ids(chat), temperature=0, max_tokens=64)
        if len(chat_ref["token_ids"]) < 64:
            break
    assert len(chat_ref["token_ids"]) < 64, "no oracle answer ended at end of sequence"

    for protocol, url in (("grpc", cpp.grpc_url), ("http", cpp.http_url)):
        with Client(url, protocol=protocol, model=cpp.model) as client:  # type: ignore[arg-type]
            with client.stream(STORY, max_tokens=12, stop=[]) as s:
                text = "".join(c.text for c in s)
            assert s.completion.finish_reason is C.FinishReason.LENGTH, protocol
            assert text == ref12
            assert s.completion.prompt_tokens == len(tok.encode(STORY))  # from the request facts

            with client.stream(STORY, max_tokens=24, stop=[stop_word]) as s:
                text = "".join(c.text for c in s)
            assert s.completion.finish_reason is C.FinishReason.STOP, protocol
            assert text == decode(ids[:at])  # up to the stop word, which is not returned

            with client.stream(messages=chat, max_tokens=64, stop=[]) as s:
                text = "".join(c.text for c in s)
            assert s.completion.finish_reason is C.FinishReason.STOP, protocol
            assert text == chat_ref["text"] and text.strip()

            done = client.complete(STORY, max_tokens=12, stream=False, stop=[])
            assert done.finish_reason is C.FinishReason.LENGTH and done.text == ref12
    _no_state(cpp)


def test_a_cancelled_stream_is_answered_cancelled_and_stops_the_engine(cpp: Any) -> None:
    import tritonclient.grpc as grpcclient

    before = metric(cpp.metrics_url, POST_FINISHED, finish_reason="cancelled")
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(cpp.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    inputs = []
    for name, dtype, value in (("text_input", "BYTES", np.array([[b"Write a long essay about Rome."]], dtype=object)),
                               ("max_tokens", "INT32", np.array([[1500]], dtype=np.int32)),
                               ("min_tokens", "INT32", np.array([[1500]], dtype=np.int32)),
                               ("stream", "BOOL", np.array([[True]]))):
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        inputs.append(t)
    client.async_stream_infer(cpp.model, inputs, request_id="cancel-me", enable_empty_final_response=True)
    for _ in range(3):
        _result, error = got.get(timeout=60)
        assert error is None, error
    client.stop_stream(cancel_requests=True)  # the client goes: Triton cancels the request
    client.close()
    assert wait_metric(cpp.metrics_url, POST_FINISHED, lambda v: v > before, 30,
                       finish_reason="cancelled") == before + 1
    assert wait_engine_gauge(cpp.metrics_url, lambda v: v == 0, 30) == 0  # the engine stopped
    _no_state(cpp)


def test_no_postprocessing_state_after_a_thousand_requests(cpp: Any, vllm_oracle: Any) -> None:
    """1,000 requests on 16 request ids, each id reused one request after another with the
    other kind of request (stop word / max_tokens reached, other prompt, other max_tokens).
    A state or facts entry left behind by a finished request would be picked up by the next
    request of its id (postprocessing keys both by it) and give that request the previous
    one's stop words, token budget and tokens: a wrong text or finish reason. The oracles are
    vLLM's offline greedy text for every (prompt, max_tokens), and the facts folder on disk."""
    finished = {r: metric(cpp.metrics_url, POST_FINISHED, finish_reason=r) for r in ("stop", "length")}
    ids = 16
    # Prompts whose greedy tokens win clearly (the oracle's top-1 logprob beats the runner-up
    # by >= 1 nat at each of the 3 positions; " girl" after STORY by 0.375 here): the served
    # engine batches 16 requests, the oracle runs one, and bf16 kernels give slightly different
    # logits per batch, so a near-tie would make the texts differ with no state involved.
    def clear(prompt: str, tokens: int = 3, margin: float = 1.0) -> bool:
        lps = vllm_oracle.generate(prompt, temperature=0, max_tokens=tokens, logprobs=2)["logprobs"]
        tops = [sorted(e.values(), reverse=True) for e in lps]
        return all(v[0] - v[1] >= margin for v in tops)

    assert vllm_oracle.generate(STORY, temperature=0, max_tokens=1)["text"] == " girl"
    assert clear(STORY, 1, margin=0.3)
    counting = (", ".join(str(k + j) for j in range(4)) + "," for k in range(2, 20))
    chosen = [p for p in counting if clear(p)][:7]
    assert len(chosen) == 7, chosen
    prompts = {(p, n): vllm_oracle.generate(p, temperature=0, max_tokens=n)["text"]
               for p in chosen for n in (1, 2, 3)}

    def kind(i: int) -> tuple[str, list[str], int]:
        # odd: the greedy text's first token is " girl", a stop word -> "stop", no text;
        # even: another prompt, max_tokens reached -> "length"
        return (STORY, [" girl"], 1 + i % 3) if i % 2 else (chosen[i % 7], [], 1 + i % 3)

    async def main() -> list[tuple[int, str, str]]:
        async with AsyncClient(cpp.grpc_url, model=cpp.model, timeout=300) as client:
            async def worker(w: int) -> list[tuple[int, str, str]]:
                out = []
                for i in range(w, REQUESTS, ids):  # ids is even: i alternates odd/even per id
                    prompt, stop, n = kind(i + (i // ids) % 2)
                    async with client.stream(prompt, max_tokens=n, stop=stop, request_id=f"reused-{w}") as s:
                        text = "".join([c.text async for c in s])
                    out.append((i + (i // ids) % 2, text, s.completion.finish_reason.value))
                return out
            return [r for rs in await asyncio.gather(*(worker(w) for w in range(ids))) for r in rs]

    started = time.monotonic()
    results = asyncio.run(main())
    took = time.monotonic() - started
    reasons = [r for _, _, r in results]
    print(f"{REQUESTS} requests on {ids} reused ids in {took:.1f} s: "
          + ", ".join(f"{r} {reasons.count(r)}" for r in sorted(set(reasons))))
    assert len(results) == REQUESTS
    for i, text, reason in results:
        prompt, stop, n = kind(i)
        if stop:
            assert (text, reason) == ("", "stop"), (i, text, reason)
        else:
            assert (text, reason) == (prompts[(prompt, n)], "length"), (i, text, reason)
    assert reasons.count("stop") == REQUESTS // 2
    after = {r: metric(cpp.metrics_url, POST_FINISHED, finish_reason=r) for r in ("stop", "length")}
    assert sum(after.values()) - sum(finished.values()) == REQUESTS
    assert after["length"] - finished["length"] == reasons.count("length")
    _no_state(cpp)


# ------------------------------------------------------------------------------------------
# Structured outputs, several sequences and log-probabilities through the C++ ensemble
# (issue 15): preprocessing lowers the guide to TensorRT-LLM's own guide types, the engine
# gets num_return_sequences / return_log_probs / guided_decoding_* by the backend's names and
# answers sequence_index / output_log_probs as the backend does, postprocessing derives each
# sequence's end from the request's facts. Oracles: the jsonschema validator, vLLM offline.
SAMPLES = 20
SEED = 1234


def test_a_json_schema_guide_holds_for_every_sample(cpp: Any) -> None:
    from test_structured_outputs import PERSON, PERSON_SCHEMA, _judge, _person_valid, _texts

    base = Request(messages=PERSON, temperature=1.0, max_tokens=40, stop=[])
    guided = _texts(cpp, "grpc", [base.replace(json_schema=PERSON_SCHEMA, seed=i) for i in range(SAMPLES)])
    free = _texts(cpp, "grpc", [base.replace(seed=i) for i in range(SAMPLES)])
    _judge("json_schema through the C++ ensemble", guided, free, _person_valid)


def test_two_sequences_equal_vllm_offline(cpp: Any, vllm_oracle: Any) -> None:
    out = vllm_oracle.generate(STORY, n=2, seed=SEED, temperature=1.0, max_tokens=16)
    want = [(o["text"], o["finish_reason"]) for o in out["outputs"]]
    assert want[0][0] != want[1][0]  # two different samples
    with Client(cpp.grpc_url, model=cpp.model) as client, \
            client.stream(Request(prompt=STORY, n=2, seed=SEED, temperature=1.0, max_tokens=16, stop=[])) as s:
        chunks = list(s)
    done = s.completion
    assert [(c.text, c.finish_reason.value) for c in done.choices] == want
    for i in range(2):  # each sequence's chunks join into its text
        assert "".join(c.text for c in chunks if c.sequence == i) == want[i][0]
    print(f"\n2 sequences through the C++ ensemble, {len(chunks)} chunks: {[c.text for c in done.choices]}")
    _no_state(cpp)


def test_log_probabilities_equal_vllm_offline(cpp: Any, vllm_oracle: Any) -> None:
    from tritonforge.triton_models.preprocess import load_tokenizer

    tok = load_tokenizer(MODEL_REF)
    out = vllm_oracle.generate(STORY, temperature=0.0, max_tokens=12, logprobs=1)
    want = [(tok.decode([t]), entry[str(t)]) for t, entry in zip(out["token_ids"], out["logprobs"])
            if t != tok.eos_token_id]
    with Client(cpp.grpc_url, model=cpp.model) as client:
        with client.stream(Request(prompt=STORY, max_tokens=12, temperature=0.0, logprobs=True, stop=[])) as s:
            streamed = [lp for c in s for lp in c.logprobs]
        got = [(t.token, t.logprob) for t in s.completion.logprobs]
        assert [(t.token, t.logprob) for t in streamed] == got
        assert len(got) == len(want) > 0
        worst = max(abs(a - b) for (_, a), (_, b) in zip(got, want))
        assert [t for t, _ in got] == [t for t, _ in want] and worst < 1e-3, (got, want)
        print(f"\n{len(got)} tokens, largest difference from vLLM offline {worst:.2e}")
        with pytest.raises(InvalidRequest, match="no alternatives") as err:  # refused, never dropped
            client.complete(Request(prompt=STORY, max_tokens=2, logprobs=True, top_logprobs=2))
        assert err.value.param == "top_logprobs"


def test_a_cancelled_request_of_several_sequences_leaves_no_state(cpp: Any) -> None:
    """Three sequences streaming, every one of them with state in postprocessing; the client
    leaves: postprocessing frees all three at once (its open-requests gauge and the facts
    folder read 0), not only the one whose response came next."""
    seen: set[int] = set()
    with Client(cpp.grpc_url, model=cpp.model) as client, \
            client.stream(Request(prompt="Write a long essay about Rome.", n=3, temperature=1.0, seed=SEED,
                                  max_tokens=400, min_tokens=400, stop=[])) as s:
        for chunk in s:
            seen.add(chunk.sequence)
            if len(seen) == 3:
                break  # leaving the block cancels the request
    assert seen == {0, 1, 2}
    assert wait_engine_gauge(cpp.metrics_url, lambda v: v == 0, 30) == 0
    _no_state(cpp)
