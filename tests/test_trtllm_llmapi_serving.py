"""The LLM-API path end to end (issue 12): ``deployments/llama3-8b-llmapi.yaml`` rendered as
is -- ensemble, pre/postprocessing, the engine model reading ``1/model.yaml`` -- served by the
real tritonserver, with TensorRT-LLM's API played by ``tests/standins/tensorrt_llm`` (real
vLLM CPU tokens underneath; no GPU here). Only the model folder and its context length are
changed to SmolLM2 on this machine.

- every way in (gRPC/HTTP, streamed/not, /generate and ModelInfer on the _sync twin) returns
  exactly vLLM's own greedy text (the vLLM oracle, offline, in its own process);
- a client that leaves a stream stops it by request id and the stand-in records the abort
  the adapter made (the engine side); nothing is left running or held afterwards;
- the LLM() arguments that reached the engine are the spec's (the stand-in's record);
- structured outputs, two sequences and log-probabilities (issue 15): a json_schema guide
  holds for 20 of 20 samples at temperature 1 (the jsonschema validator) where unguided ones
  mostly fail, and n=2 with a seed and greedy log-probabilities with their top alternatives
  equal vLLM offline.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import engine_gauge, wait_engine_gauge
from tritonforge import contract as C
from tritonforge.clients import Client, Request
from trtllm_support import STANDINS, load_example, metric, smollm2_folder, start, write_repo

PROMPTS = {
    "story": ("Once upon a time, there was a little", 24),
    "chinese": ("上海是中国最大的城市之一。北京是", 24),
}
SPEC = "llama3-8b-llmapi"
POST_OPEN = "tritonforge_postprocessing_open_requests"


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def llmapi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("llmapi")
    data = load_example(SPEC, model={"path": str(smollm2_folder()), "max_model_len": 2048},
                        instances={"preprocessing": 1})
    repo = write_repo(data, tmp / "repo")
    record = tmp / "standin-record.jsonl"
    server, handle = start(repo, log_name="trtllm-llmapi",
                           env={"PYTHONPATH": str(STANDINS), "TRTLLM_STANDIN_RECORD": str(record)})
    handle.model = data["name"]
    try:
        yield handle, record
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(vllm_oracle_eager: Any) -> dict[str, str]:
    return {k: vllm_oracle_eager.generate(p, temperature=0, max_tokens=n)["text"] for k, (p, n) in PROMPTS.items()}


def test_the_engine_is_the_llm_api_with_the_specs_arguments(llmapi: Any) -> None:
    handle, record = llmapi
    llm = [r for r in _records(record) if r["event"] == "llm"]
    # one tensorrt_llm.LLM for the engine model (per server: trtllm_support.start starts a
    # second one when the first is not ready in time)
    assert llm and len({r["pid"] for r in llm}) == len(llm), "one tensorrt_llm.LLM for the engine model"
    args = yaml.safe_load((handle.repo / C.MODEL_TENSORRT_LLM / "1" / "model.yaml").read_text())
    assert llm[0]["model"] == args["model"] == str(smollm2_folder())
    for key in ("backend", "max_batch_size", "max_seq_len", "enable_chunked_prefill", "kv_cache_config",
                "max_num_tokens", "pipeline_parallel_size"):
        assert llm[0][key] == args[key], key
    assert llm[0]["tensor_parallel_size"] == args["tensor_parallel_size"] == 1
    assert args["kv_cache_config"]["enable_block_reuse"] is True  # the spec's prefix_caching


def _grpc_infer(url: str, model: str, prompt: str, n: int) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    mt = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    mt.set_data_from_numpy(np.array([[n]], dtype=np.int32))
    stop = grpcclient.InferInput("stop_words", [1, 1], "BYTES")
    stop.set_data_from_numpy(np.array([[b""]], dtype=object))
    out = client.infer(model, [text, mt, stop], client_timeout=120)
    client.close()
    return bytes(out.as_numpy("text_output").reshape(-1)[0]).decode()


def _http_generate(url: str, model: str, prompt: str, n: int) -> str:
    body = json.dumps({"text_input": prompt, "max_tokens": n, "stop_words": [""]}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    return str(json.loads(urllib.request.urlopen(req, timeout=120).read())["text_output"])


@pytest.mark.parametrize("key", list(PROMPTS))
def test_every_path_gives_vllms_greedy_text(llmapi: Any, reference: dict[str, str], key: str) -> None:
    handle, record = llmapi
    prompt, n = PROMPTS[key]
    before = len([r for r in _records(record) if r["event"] == "generate"])
    texts: dict[str, str] = {}
    for protocol, url in (("grpc", handle.grpc_url), ("http", handle.http_url)):
        with Client(url, protocol=protocol, model=handle.model) as client:  # type: ignore[arg-type]
            with client.stream(prompt, max_tokens=n, stop=[]) as stream:
                texts[f"{protocol}-stream"] = "".join(c.text for c in stream)
            assert stream.completion.finish_reason in (C.FinishReason.LENGTH, C.FinishReason.STOP)
            assert stream.completion.prompt_tokens > 0
            texts[f"{protocol}-nostream"] = client.complete(prompt, max_tokens=n, stream=False, stop=[]).text
    sync = f"{handle.model}_sync"
    texts["http-generate"] = _http_generate(handle.http_url, sync, prompt, n)
    texts["grpc-infer"] = _grpc_infer(handle.grpc_url, sync, prompt, n)
    assert reference[key]
    assert texts == {k: reference[key] for k in texts}, texts
    # every one of them went through the LLM API's generate_async
    assert len([r for r in _records(record) if r["event"] == "generate"]) - before == len(texts)


def test_leaving_a_stream_aborts_it_in_the_llm_api(llmapi: Any) -> None:
    handle, record = llmapi
    aborts_before = {r["request_id"] for r in _records(record) if r["event"] == "abort"}
    with Client(handle.grpc_url, model=handle.model) as client, \
            client.stream("Write a very long essay about the history of Rome.", max_tokens=400,
                          min_tokens=400) as s:
        for chunk in s:
            if chunk.index >= 3:
                break  # leaving the block stops the request by its request id
    deadline = time.monotonic() + 30
    new: set[int] = set()
    while time.monotonic() < deadline and not new:
        new = {r["request_id"] for r in _records(record) if r["event"] == "abort"} - aborts_before
        time.sleep(0.2)
    assert new, "the stand-in saw no abort: the cancellation did not reach the LLM API"
    generated = [r["request_id"] for r in _records(record) if r["event"] == "generate"]
    assert new <= set(generated) and generated[-1] in new  # it was this stream's request
    assert wait_engine_gauge(handle.metrics_url, lambda v: v == 0, 30) == 0
    assert engine_gauge(handle.metrics_url, "tritonforge_engine_requests_waiting") == 0
    deadline = time.monotonic() + 10
    while metric(handle.metrics_url, POST_OPEN) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(handle.metrics_url, POST_OPEN) == 0


# ------------------------------------------------------------------------------------------
# Structured outputs, several sequences and log-probabilities through the LLM-API ensemble
# (issue 15): the adapter asks SamplingParams(n=, logprobs=, guided_decoding=
# GuidedDecodingParams(...)) of an LLM made with guided_decoding_backend (model.yaml).
# Oracles: the jsonschema validator, vLLM offline.
SAMPLES = 20
SEED = 1234


def test_a_json_schema_guide_holds_for_every_sample(llmapi: Any) -> None:
    from test_structured_outputs import PERSON, PERSON_SCHEMA, _judge, _person_valid, _texts

    handle, record = llmapi
    llm = [r for r in _records(record) if r["event"] == "llm"]
    assert llm[-1]["guided_decoding_backend"] == "xgrammar"  # model.yaml's, as generated
    base = Request(messages=PERSON, temperature=1.0, max_tokens=40, stop=[])
    before = len(_records(record))
    guided = _texts(handle, "grpc", [base.replace(json_schema=PERSON_SCHEMA, seed=i) for i in range(SAMPLES)])
    asked = [r for r in _records(record)[before:] if r["event"] == "generate"]
    assert len(asked) == SAMPLES and all(r["guided"] for r in asked)  # GuidedDecodingParams reached the LLM
    free = _texts(handle, "grpc", [base.replace(seed=i) for i in range(SAMPLES)])
    _judge("json_schema through the LLM-API ensemble", guided, free, _person_valid)


def test_two_sequences_equal_vllm_offline(llmapi: Any, vllm_oracle_eager: Any) -> None:
    handle, record = llmapi
    prompt = PROMPTS["story"][0]
    out = vllm_oracle_eager.generate(prompt, n=2, seed=SEED, temperature=1.0, max_tokens=16)
    want = [(o["text"], o["finish_reason"]) for o in out["outputs"]]
    assert want[0][0] != want[1][0]  # two different samples
    with Client(handle.grpc_url, model=handle.model) as client, \
            client.stream(Request(prompt=prompt, n=2, seed=SEED, temperature=1.0, max_tokens=16, stop=[])) as s:
        chunks = list(s)
    done = s.completion
    assert [r for r in _records(record) if r["event"] == "generate"][-1]["n"] == 2
    assert [(c.text, c.finish_reason.value) for c in done.choices] == want
    for i in range(2):
        assert "".join(c.text for c in chunks if c.sequence == i) == want[i][0]
    print(f"\n2 sequences through the LLM-API ensemble, {len(chunks)} chunks: {[c.text for c in done.choices]}")


def test_log_probabilities_equal_vllm_offline(llmapi: Any, vllm_oracle_eager: Any) -> None:
    from test_logprobs import MAX, PROMPT, TOP, _oracle, _same, _typed
    from tritonforge.triton_models.preprocess import load_tokenizer

    handle, record = llmapi
    want = _oracle(vllm_oracle_eager, load_tokenizer("package:smollm2-135m-instruct"), PROMPT)
    with Client(handle.grpc_url, model=handle.model) as client, \
            client.stream(Request(prompt=PROMPT, max_tokens=MAX, temperature=0.0, logprobs=True,
                                  top_logprobs=TOP, stop=[])) as stream:
        chunks = list(stream)
    assert [r for r in _records(record) if r["event"] == "generate"][-1]["logprobs"] == TOP
    assert [lp for c in chunks for lp in c.logprobs] == list(stream.completion.logprobs)
    _same(_typed(stream.completion.logprobs), want)
