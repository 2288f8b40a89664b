"""The OpenAI gateway against the real server (bundled tritonserver + vLLM + SmolLM2), driven
by the official ``openai`` SDK; the gateway runs in-process on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families
from tritonforge.triton_models.metrics import REQUESTS_FINISHED as FINISHED
from conftest import chat_prompt_ids, engine_gauge, wait_engine_gauge
from tritonforge.triton_models.metrics import REQUESTS_RUNNING
from tritonforge.clients import Client, InvalidRequest
from tritonforge.gateway import GatewayHandle, run_gateway_in_thread
from tritonforge.runtime.server import free_port

pytestmark = pytest.mark.server

PROMPT = "Once upon a time, there was a little"
QUESTION = "What is the capital of France?"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
MAX = 24
LONG = 384  # a request still running when the test leaves it (see test_clients_server)
SETTLE = 5.0
VERY_LONG = 1536  # with the prompt, within the default 2048-token context
CANCEL_SETTLE = 30.0  # a busy shared machine can take seconds per step; VERY_LONG takes minutes


@pytest.fixture(scope="module")
def gateway(triton_server: Any) -> Iterator[GatewayHandle]:
    with run_gateway_in_thread(triton_server.grpc_url, triton_server.model) as handle:
        yield handle


@pytest.fixture(scope="module")
def sdk(gateway: GatewayHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def typed(triton_server: Any) -> Iterator[Client]:
    with Client(triton_server.grpc_url, model=triton_server.model) as client:
        yield client


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _running(metrics_url: str) -> float:
    return engine_gauge(metrics_url, REQUESTS_RUNNING)


def _wait_running(metrics_url: str, predicate: Any, seconds: float = SETTLE) -> float:
    return wait_engine_gauge(metrics_url, predicate, seconds, REQUESTS_RUNNING)


# ---------------------------------------------------------------------------- same text
def test_models_lists_the_served_ensemble(sdk: openai.OpenAI, triton_server: Any) -> None:
    assert [m.id for m in sdk.models.list()] == [triton_server.model]


def test_chat_greedy_equals_typed_client_streamed_or_not(sdk: openai.OpenAI, typed: Client,
                                                         triton_server: Any, vllm_oracle: Any) -> None:
    want = typed.chat([{"role": "user", "content": QUESTION}], max_tokens=MAX,
                      temperature=0.0)
    oracle = vllm_oracle.generate(chat_prompt_ids([{"role": "user", "content": QUESTION}]),
                                  temperature=0, max_tokens=MAX)
    reply = sdk.chat.completions.create(model=triton_server.model, messages=CHAT,
                                        max_tokens=MAX, temperature=0.0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == want.text
    assert want.text == oracle["text"] and choice.finish_reason == want.finish_reason.value
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (want.prompt_tokens,
                                                                          want.completion_tokens)
    assert reply.usage.total_tokens == want.prompt_tokens + want.completion_tokens

    chunks = list(sdk.chat.completions.create(
        model=triton_server.model, messages=CHAT, max_completion_tokens=MAX,
        temperature=0.0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [want.finish_reason.value]
    assert all(c.usage is None for c in chunks[:-1]) and not chunks[-1].choices
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        want.prompt_tokens, want.completion_tokens, want.prompt_tokens + want.completion_tokens)


def test_completions_greedy_equals_typed_client_streamed_or_not(sdk: openai.OpenAI, typed: Client,
                                                                triton_server: Any) -> None:
    want = typed.complete(PROMPT, max_tokens=MAX, temperature=0.0)
    assert want.finish_reason.value == "length" and want.completion_tokens == MAX
    reply = sdk.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=MAX, temperature=0.0)
    assert reply.choices[0].text == want.text and reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (
        want.prompt_tokens, MAX, want.prompt_tokens + MAX)

    chunks = list(sdk.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=MAX,
                                         temperature=0.0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # usage only when asked for


def test_stop_seed_and_max_tokens(sdk: openai.OpenAI, triton_server: Any, vllm_oracle: Any) -> None:
    # a stop string a few words into vLLM's own greedy answer: the reply ends just before it
    greedy = vllm_oracle.generate(chat_prompt_ids([{"role": "user", "content": QUESTION}]),
                                  temperature=0, max_tokens=MAX)["text"]
    stop = " " + greedy.split(" ")[3]
    assert stop.strip() and greedy.find(stop) > 0, greedy
    reply = sdk.chat.completions.create(model=triton_server.model, messages=CHAT,
                                        max_tokens=MAX, temperature=0.0, stop=[stop])
    assert reply.choices[0].message.content == greedy[:greedy.find(stop)]
    assert reply.choices[0].finish_reason == "stop"

    def sampled(seed: int) -> str:
        r = sdk.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=12,
                                   temperature=1.0, top_p=0.95, seed=seed)
        return r.choices[0].text

    assert sampled(7) == sampled(7)
    assert len({sampled(s) for s in (1, 2, 3)}) > 1, "the seed does not reach the sampler"


# ---------------------------------------------------------------------------- errors
def test_bad_max_tokens_is_bad_request_with_the_servers_message(sdk: openai.OpenAI, triton_server: Any) -> None:
    with Client(triton_server.grpc_url, model=triton_server.model) as raw:
        raw.check_requests = False  # what the server itself answers
        for bad in (0, 5000):
            with pytest.raises(InvalidRequest) as server:
                raw.complete(PROMPT, max_tokens=bad)
            with pytest.raises(openai.BadRequestError) as exc:
                sdk.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=bad)
            assert exc.value.status_code == 400
            body: Any = exc.value.body
            assert body["message"] == server.value.server_message
            assert body["param"] == "max_tokens" and body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        sdk.chat.completions.create(model=triton_server.model, messages=CHAT, n=2)


def test_unknown_model_is_not_found(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert exc.value.code == "model_not_found"


def test_api_key_is_enforced(triton_server: Any) -> None:
    with run_gateway_in_thread(triton_server.grpc_url, triton_server.model, api_key="s3cret") as gw:
        with openai.OpenAI(base_url=gw.url, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
            with pytest.raises(openai.AuthenticationError):
                bad.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=2)
        with openai.OpenAI(base_url=gw.url, api_key="s3cret", max_retries=0) as good:
            reply = good.completions.create(model=triton_server.model, prompt=PROMPT, max_tokens=2)
            assert reply.usage is not None and reply.usage.completion_tokens == 2


# ---------------------------------------------------------------------------- cancellation
def _cancelled_on_triton(metrics_url: str) -> float:
    """Cancellations seen on Triton: requests it counts CANCELED (any model, the ensemble's
    steps included) plus those the engine reports finished as cancelled."""
    total = 0.0
    for (name, labels), v in _metrics(f"http://{metrics_url}/metrics").items():
        if name.startswith("nv_inference_request_failure") and ("reason", "CANCELED") in labels or name.startswith(FINISHED) and ("finish_reason", "cancelled") in labels:
            total += v
    return total


def test_client_disconnect_mid_stream_cancels_the_triton_request(gateway: GatewayHandle,
                                                                 triton_server: Any) -> None:
    # Other clients may share the server (TRITONFORGE_TEST_SERVER), so the engine's
    # running-requests gauge is not ours alone: Triton's CANCELED count only grows when a
    # request is cancelled, and a VERY_LONG generation cannot end by itself within CANCEL_SETTLE
    # (>= 0.09 s per token here even on an idle machine).
    metrics, url = triton_server.metrics_url, gateway.url.removesuffix("/v1") + "/metrics"
    closed = (("endpoint", "/v1/completions"), ("status", "499"))
    in_flight = ("tritonforge_gateway_requests_in_flight", (("endpoint", "/v1/completions"),))

    def closed_count() -> float:
        return _metrics(url).get(("tritonforge_gateway_requests_total", closed), 0.0)

    before, closed_before = _cancelled_on_triton(metrics), closed_count()
    body = {"model": triton_server.model, "prompt": PROMPT, "max_tokens": VERY_LONG,
            "min_tokens": VERY_LONG, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{gateway.url}/completions", json=body) as r:
        assert r.status_code == 200
        events = 0
        for line in r.iter_lines():
            events += line.startswith("data: ")
            if events >= 3:
                break
        assert _wait_running(metrics, lambda v: v >= 1) >= 1, "the request is not running"
    left = time.monotonic()
    while closed_count() == closed_before and time.monotonic() - left < SETTLE:
        time.sleep(0.1)
    assert closed_count() == closed_before + 1, "the gateway did not notice the client leaving"
    assert _metrics(url)[in_flight] == 0
    while _cancelled_on_triton(metrics) <= before and time.monotonic() - left < CANCEL_SETTLE:
        time.sleep(0.2)
    assert _cancelled_on_triton(metrics) > before, "Triton did not see the request cancelled"


# ---------------------------------------------------------------------------- metrics
def test_metrics_count_requests_tokens_and_ttft(gateway: GatewayHandle, sdk: openai.OpenAI,
                                                triton_server: Any) -> None:
    url = gateway.url.removesuffix("/v1") + "/metrics"
    ep = (("endpoint", "/v1/chat/completions"),)
    before = _metrics(url)

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ep) -> float:
        return _metrics(url).get((name, labels), 0.0) - before.get((name, labels), 0.0)

    reply = sdk.chat.completions.create(model=triton_server.model, messages=CHAT, max_tokens=8)
    chunks = list(sdk.chat.completions.create(model=triton_server.model, messages=CHAT,
                                              max_tokens=8, stream=True,
                                              stream_options={"include_usage": True}))
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model=triton_server.model, messages=CHAT, max_tokens=0)
    assert reply.usage is not None and chunks[-1].usage is not None
    ok = (("endpoint", "/v1/chat/completions"), ("status", "200"))
    refused = (("endpoint", "/v1/chat/completions"), ("status", "400"))
    assert delta("tritonforge_gateway_requests_total", ok) == 2
    assert delta("tritonforge_gateway_requests_total", refused) == 1
    assert delta("tritonforge_gateway_completion_tokens_total") == (
        reply.usage.completion_tokens + chunks[-1].usage.completion_tokens)
    assert delta("tritonforge_gateway_prompt_tokens_total") == 2 * reply.usage.prompt_tokens
    assert delta("tritonforge_gateway_time_to_first_token_seconds_count") == 1  # the streamed one
    assert delta("tritonforge_gateway_request_duration_seconds_count") == 3
    assert _metrics(url)[("tritonforge_gateway_requests_in_flight", ep)] == 0


# ---------------------------------------------------------------------------- CLI
def test_cli_serves_until_sigterm(triton_server: Any) -> None:
    port = free_port()
    env = {**os.environ, "TRITONFORGE_OPENAI_API_KEY": "k"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tritonforge.cli import main; main()", "gateway",
         "--triton-url", triton_server.grpc_url, "--model", triton_server.model, "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"authorization": "Bearer k"})
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
                time.sleep(0.2)
        assert reply.status_code == 200 and reply.json()["data"][0]["id"] == triton_server.model
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status 143).
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err and "error" not in err.lower()
