"""End to end through the real bundled tritonserver, real vLLM and SmolLM2 (issue 3).

- every way in (gRPC stream, HTTP SSE stream, gRPC ModelInfer and HTTP /generate on the
  non-decoupled twin) gives the same greedy text, equal to vLLM's own greedy output;
- streamed pieces concatenate to the non-streamed text, multi-byte characters included;
- 16 concurrent streams complete, served in one running batch;
- a stream cancelled mid-way leaves the engine with no running request;
- the TensorRT-LLM ensemble runs on the CPU with only its engine step swapped.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import engine_gauge
from tritonforge import contract
from tritonforge.clients import AsyncClient, Client, InvalidRequest

ROOT = Path(__file__).resolve().parents[1]
MODEL_REF = "package:smollm2-135m-instruct"

PROMPTS = {
    "story": ("Once upon a time, there was a little", 24),
    "chinese": ("上海是中国最大的城市之一。北京是", 40),
    "spaces": ("def add(a, b):\n    ", 24),
}


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tritonforge_engine_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module")
def vllm_reference(vllm_oracle) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """vLLM's own greedy text for each prompt (offline LLM API, in its own process)."""
    return {key: vllm_oracle.generate(prompt, temperature=0, max_tokens=n)["text"]
            for key, (prompt, n) in PROMPTS.items()}


def _http_generate(http_url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(f"http://{http_url}/v2/models/{model}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


def _grpc_infer(grpc_url: str, model: str, prompt: str, max_tokens: int) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    mt = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    mt.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    result = client.infer(model, [text, mt], client_timeout=120)
    client.close()
    return bytes(result.as_numpy("text_output").reshape(-1)[0]).decode()


@pytest.mark.parametrize("key", list(PROMPTS))
def test_every_path_gives_vllms_greedy_text(triton_server, vllm_reference, key: str) -> None:  # type: ignore[no-untyped-def]
    prompt, n = PROMPTS[key]
    expected = vllm_reference[key]
    assert expected  # vLLM generated something
    texts: dict[str, str] = {}
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with Client(url, protocol=protocol, model=triton_server.model) as client:
            with client.stream(prompt, max_tokens=n, temperature=0.0) as stream:
                pieces = [chunk.text for chunk in stream]
            done = stream.completion
            texts[f"{protocol}-stream"] = "".join(pieces)
            assert done.text == texts[f"{protocol}-stream"]
            assert done.completion_tokens > 0 and done.prompt_tokens > 0
            assert done.finish_reason in (contract.FinishReason.LENGTH, contract.FinishReason.STOP)
            texts[f"{protocol}-nostream"] = client.complete(prompt, max_tokens=n, stream=False).text
    sync_model = f"{triton_server.model}_sync"
    texts["http-generate"] = _http_generate(triton_server.http_url, sync_model, prompt, n)["text_output"]
    texts["grpc-infer"] = _grpc_infer(triton_server.grpc_url, sync_model, prompt, n)
    assert texts == {k: expected for k in texts}, texts


def test_streamed_pieces_keep_multibyte_characters(triton_server) -> None:  # type: ignore[no-untyped-def]
    prompt, n = PROMPTS["chinese"]
    with Client(triton_server.grpc_url, model=triton_server.model) as client:
        with client.stream(prompt, max_tokens=n) as stream:
            pieces = [chunk.text for chunk in stream]
        whole = client.complete(prompt, max_tokens=n, stream=False).text
    assert len(pieces) > 5
    assert "".join(pieces) == whole
    assert re.search(r"[\u4e00-\u9fff]", whole)  # the output really is Chinese
    assert all("\ufffd" not in p for p in pieces[:-1])  # no piece splits a character


def test_sixteen_concurrent_streams_share_the_running_batch(triton_server) -> None:  # type: ignore[no-untyped-def]
    async def one(client: AsyncClient, i: int) -> tuple[float, float, str]:
        async with client.stream(f"Story number {i}: Once upon a time", max_tokens=24) as s:
            first = None
            async for chunk in s:
                if first is None and chunk.text:
                    first = time.monotonic()
        assert first is not None
        return first, time.monotonic(), s.completion.finish_reason.value

    async def run() -> list[tuple[float, float, str]]:
        async with AsyncClient(triton_server.grpc_url, model=triton_server.model) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    results = asyncio.run(run())
    assert len(results) == 16
    assert all(reason in ("length", "stop") for _, _, reason in results)
    # Continuous batching: every stream had its first token before the first stream ended,
    # so all 16 were in the engine at once rather than served one after another.
    first_end = min(end for _, end, _ in results)
    assert sum(1 for first, _, _ in results if first < first_end) >= 12


def test_cancelling_a_stream_stops_generation(triton_server) -> None:  # type: ignore[no-untyped-def]
    before = _metrics(triton_server.metrics_url)
    gen_key = next(k for k in before if k.startswith("tritonforge_engine_generation_tokens_total"))
    with Client(triton_server.grpc_url, model=triton_server.model) as client:
        with client.stream("Write a very long essay about the history of Rome.", max_tokens=1500) as s:
            for i, _chunk in enumerate(s):
                if i == 3:
                    break
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if engine_gauge(triton_server.metrics_url, "tritonforge_engine_requests_running") == 0:
            break
        time.sleep(0.2)
    assert engine_gauge(triton_server.metrics_url, "tritonforge_engine_requests_running") == 0
    assert engine_gauge(triton_server.metrics_url, "tritonforge_engine_requests_waiting") == 0
    time.sleep(1.0)
    after = _metrics(triton_server.metrics_url)
    # Generation stopped long before max_tokens: the engine aborted the request.
    assert after[gen_key] - before[gen_key] < 1000


def _swap_engine(trtllm_repo: Path, cpu_repo: Path) -> None:
    """Replace the TensorRT-LLM engine step by tritonforge's CPU engine model under the same
    name and contract, and point pre/postprocessing at the CPU model's tokenizer."""
    name = contract.MODEL_TENSORRT_LLM
    shutil.rmtree(trtllm_repo / name)
    shutil.copytree(cpu_repo / contract.MODEL_VLLM_ENGINE, trtllm_repo / name)
    cfg = trtllm_repo / name / "config.pbtxt"
    batch = re.search(r"max_batch_size: (\d+)", (trtllm_repo / contract.MODEL_PREPROCESSING / "config.pbtxt").read_text())
    assert batch is not None
    text = cfg.read_text().replace(f'name: "{contract.MODEL_VLLM_ENGINE}"', f'name: "{name}"')
    cfg.write_text(re.sub(r"max_batch_size: \d+", f"max_batch_size: {batch.group(1)}", text))
    key = contract.Param.MODEL.value
    for model in (contract.MODEL_PREPROCESSING, contract.MODEL_POSTPROCESSING):
        path = trtllm_repo / model / "config.pbtxt"
        text = re.sub(rf'(key: "{key}"\s*value \{{\s*string_value: )"[^"]*"', rf'\1"{MODEL_REF}"', path.read_text())
        text = re.sub(rf'(key: "{contract.Param.TOKENIZER.value}"\s*value \{{\s*string_value: )"[^"]*"',
                      rf'\1"{MODEL_REF}"', text)
        path.write_text(text)


def test_tensorrt_llm_ensemble_runs_with_the_cpu_engine(tmp_path: Path, vllm_reference) -> None:  # type: ignore[no-untyped-def]
    from conftest import start_server
    from tritonforge.render.renderer import render_files
    from tritonforge.render.validate import validate_repository
    from tritonforge.render.write import write_repository
    from tritonforge.spec import load_spec

    trt = tmp_path / "trtllm"
    write_repository(trt, render_files(load_spec(ROOT / "deployments" / "llama3-8b-trtllm-fp8.yaml")))
    cpu = tmp_path / "cpu"
    write_repository(cpu, render_files(load_spec(ROOT / "deployments" / "default.yaml")))
    ensemble = next(p.parent.name for p in trt.glob("*/config.pbtxt")
                    if 'platform: "ensemble"' in p.read_text())
    ensemble_before = (trt / ensemble / "config.pbtxt").read_text()
    _swap_engine(trt, cpu)
    assert (trt / ensemble / "config.pbtxt").read_text() == ensemble_before  # same wiring
    assert 'backend: "tensorrtllm"' not in (trt / contract.MODEL_TENSORRT_LLM / "config.pbtxt").read_text()
    assert validate_repository(trt) == []

    server, handle = start_server(trt, log_name="trtllm-swap")
    try:
        prompt, n = PROMPTS["story"]
        with Client(handle.grpc_url, model=ensemble) as client:
            with client.stream(prompt, max_tokens=n, stop=[]) as s:
                text = "".join(chunk.text for chunk in s)
        assert text == vllm_reference["story"]
    finally:
        server.stop()  # type: ignore[attr-defined]


def test_min_p_is_honoured_and_equals_vllm(triton_server, vllm_oracle) -> None:  # type: ignore[no-untyped-def]
    """min_p (added as one row of the parameter table): sampled output with a fixed seed is
    vLLM's own for the same SamplingParams, and differs from the output without min_p."""
    prompt, n = PROMPTS["story"]
    changed = 0
    with Client(triton_server.grpc_url, model=triton_server.model) as client:
        for seed in (11, 12, 13):
            served = client.complete(prompt, max_tokens=n, temperature=1.5, min_p=0.3, seed=seed).text
            plain = client.complete(prompt, max_tokens=n, temperature=1.5, seed=seed).text
            want = vllm_oracle.generate(prompt, max_tokens=n, temperature=1.5, min_p=0.3, seed=seed)["text"]
            assert served == want, seed
            changed += served != plain
    assert changed, "min_p=0.3 never changed the sampled text"
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with Client(url, protocol=protocol, model=triton_server.model, check_requests=False) as client:  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match=r"min_p must be a number in \[0, 1\]") as info:
                client.complete(prompt, max_tokens=4, min_p=2.0)
            assert info.value.param == "min_p"
