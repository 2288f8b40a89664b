"""``num_return_sequences`` (OpenAI ``n``) through the real server (bundled tritonserver +
vLLM + SmolLM2, CPU): three sequences sampled at temperature 1 with a fixed seed, each equal
to vLLM's own offline output for the same seed (tests/vllm_oracle.py), over the typed gRPC
client (streamed: each chunk says its sequence) and the OpenAI gateway (official ``openai``
SDK, streamed and not); the one-sequence models refuse n > 1 naming the field; a cancelled
request of three sequences leaves no postprocessing state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from tritonforge.clients import Client, Request
from tritonforge.gateway import run_gateway_in_thread

pytestmark = pytest.mark.server

PROMPT = "Once upon a time, there was a little"
N = 3
SEED = 1234
MAX = 16


@pytest.fixture(scope="module")
def want(vllm_oracle: Any) -> list[tuple[str, str]]:
    """vLLM offline: each sequence's (text, finish reason)."""
    out = vllm_oracle.generate(PROMPT, n=N, seed=SEED, temperature=1.0, max_tokens=MAX)
    return [(o["text"], o["finish_reason"]) for o in out["outputs"]]


@pytest.fixture(scope="module")
def sdk(triton_server: Any) -> Iterator[openai.OpenAI]:
    with run_gateway_in_thread(triton_server.grpc_url, triton_server.model) as handle, \
            openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def test_typed_client_n_sequences_equal_vllm_offline(triton_server: Any, want: list[tuple[str, str]]) -> None:
    assert len({t for t, _ in want}) == N  # three different samples
    with Client(triton_server.grpc_url, model=triton_server.model) as client, \
            client.stream(Request(prompt=PROMPT, n=N, seed=SEED, temperature=1.0, max_tokens=MAX)) as stream:
        chunks = list(stream)
        done = stream.completion
    assert [(c.text, c.finish_reason.value) for c in done.choices] == want
    assert [c.index for c in done.choices] == list(range(N)) and done.text == want[0][0]
    for i in range(N):  # the chunks of each sequence join into its text
        assert "".join(c.text for c in chunks if c.sequence == i) == want[i][0]
    assert done.completion_tokens == sum(c.tokens for c in done.choices)
    print(f"\n{N} sequences, {len(chunks)} chunks: {[c.text for c in done.choices]}")


def test_gateway_n_choices_equal_vllm_offline(sdk: openai.OpenAI, triton_server: Any,
                                              want: list[tuple[str, str]]) -> None:
    kw: dict[str, Any] = {"model": triton_server.model, "prompt": PROMPT, "n": N, "seed": SEED,
                          "temperature": 1.0, "max_tokens": MAX}
    reply = sdk.completions.create(**kw)
    assert [(c.index, c.text, c.finish_reason) for c in sorted(reply.choices, key=lambda c: c.index)] == \
        [(i, t, f) for i, (t, f) in enumerate(want)]
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in sdk.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert [(texts[i], finish[i]) for i in range(N)] == want


def test_one_sequence_models_refuse_n(triton_server: Any) -> None:
    body = {"text_input": PROMPT, "max_tokens": 4, "num_return_sequences": 2}
    reply = httpx.post(f"http://{triton_server.http_url}/v2/models/{triton_server.model}_sync/generate",
                       json=body, timeout=120)
    assert reply.status_code == 400 and "num_return_sequences must be 1" in reply.json()["error"]


def test_a_cancelled_request_frees_every_sequences_state(triton_server: Any) -> None:
    """Three sequences streaming, each with detokenizer state in postprocessing; the client
    leaves: all three states go at once (postprocessing's open-requests gauge reads 0 again),
    not only the one whose response came next (the others would wait for the size bound)."""
    from conftest import wait_engine_gauge
    from tritonforge.triton_models.metrics import POST_OPEN_REQUESTS
    from trtllm_support import wait_metric

    seen: set[int] = set()
    with Client(triton_server.grpc_url, model=triton_server.model) as client, \
            client.stream(Request(prompt="Write a long essay about Rome.", n=N, seed=SEED, temperature=1.0,
                                  max_tokens=400, min_tokens=400)) as stream:
        for chunk in stream:
            seen.add(chunk.sequence)
            if len(seen) == N:
                break  # every sequence has state now; leaving the block cancels the request
    assert seen == set(range(N))
    assert wait_engine_gauge(triton_server.metrics_url, lambda v: v == 0, 30) == 0
    assert wait_metric(triton_server.metrics_url, POST_OPEN_REQUESTS, lambda v: v == 0) == 0
