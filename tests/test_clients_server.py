"""The typed clients against the real server (bundled tritonserver + vLLM + SmolLM2).

Uses the session fixture ``triton_server`` from conftest (http_url, grpc_url, metrics_url,
model).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import chat_prompt_ids, engine_gauge, wait_engine_gauge
from tritonforge.triton_models.metrics import REQUESTS_RUNNING
from tritonforge.clients import (
    AsyncClient,
    Cancelled,
    Client,
    Completion,
    FinishReason,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    Request,
    ServerUnavailable,
    StreamConsumed,
    Timeout,
)
from typer.testing import CliRunner

pytestmark = pytest.mark.server

PROMPT = "Once upon a time, there was a little"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROTOCOLS = ("grpc", "http")
# max_tokens (and min_tokens) of a request that is still running when the test leaves it:
# on this CPU it takes far longer than SETTLE, so only a cancelled request stops within it.
LONG = 384
SETTLE = 5.0  # seconds the engine gets to drop a cancelled request


def _url(server: Any, protocol: str) -> str:
    return str(server.grpc_url if protocol == "grpc" else server.http_url)


@pytest.fixture(scope="module")
def clients(triton_server: Any) -> Iterator[dict[str, Client]]:
    made = {p: Client(_url(triton_server, p), protocol=p, model=triton_server.model) for p in PROTOCOLS}
    yield made
    for c in made.values():
        c.close()


def _running(metrics_url: str) -> float:
    return engine_gauge(metrics_url, REQUESTS_RUNNING)


def _wait_running(metrics_url: str, predicate: Any, seconds: float = SETTLE) -> float:
    return wait_engine_gauge(metrics_url, predicate, seconds, REQUESTS_RUNNING)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens


# ---------------------------------------------------------------------------- same text
def _sync_run(client: Client, req: Request) -> tuple[str, Completion]:
    with client.stream(req) as s:
        streamed = "".join(c.text for c in s)
        return streamed, s.completion


async def _async_run(url: str, protocol: str, model: str, req: Request) -> tuple[str, Completion]:
    client = AsyncClient(url, protocol=protocol, model=model)  # type: ignore[arg-type]
    async with client, client.stream(req) as s:
        streamed = "".join([c.text async for c in s])
        return streamed, s.completion


def test_both_transports_sync_async_stream_nonstream_same_greedy_text(triton_server: Any) -> None:
    results: dict[tuple[str, str, bool], Completion] = {}
    for protocol in PROTOCOLS:
        url = _url(triton_server, protocol)
        with Client(url, protocol=protocol, model=triton_server.model) as client:  # type: ignore[arg-type]
            for stream in (True, False):
                req = Request(prompt=PROMPT, max_tokens=24, temperature=0.0, stream=stream)
                streamed, done = _sync_run(client, req)
                assert streamed == done.text
                results[(protocol, "sync", stream)] = done
                streamed, done = asyncio.run(_async_run(url, protocol, triton_server.model, req))
                assert streamed == done.text
                results[(protocol, "async", stream)] = done
    texts = {key: c.text for key, c in results.items()}
    reference = texts[("grpc", "sync", True)]
    assert reference.strip(), "the model generated nothing"
    assert all(t == reference for t in texts.values()), texts
    for (_, _, stream), done in results.items():
        assert done.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert done.completion_tokens == results[("grpc", "sync", True)].completion_tokens
        assert done.prompt_tokens > 0
        assert done.ttft is not None and 0 < done.ttft <= done.latency
        if stream:
            assert done.chunks > 1 and len(done.inter_token_latencies) >= 1
            assert done.itl is not None and done.itl > 0
        else:
            assert done.chunks == 1


def test_chat_same_on_both_transports(clients: dict[str, Client], vllm_oracle: Any) -> None:
    texts = {p: c.chat(CHAT, max_tokens=16, temperature=0.0).text for p, c in clients.items()}
    want = vllm_oracle.generate(chat_prompt_ids(CHAT), temperature=0, max_tokens=16)["text"]
    assert want.strip() and texts == {"grpc": want, "http": want}


def test_discovers_the_one_ensemble(triton_server: Any) -> None:
    key = triton_server.admin_key
    for protocol in PROTOCOLS:
        url = _url(triton_server, protocol)
        with Client(url, protocol=protocol, admin_key=key) as client:  # type: ignore[arg-type]
            assert client.model is None
            assert client.ready()
            assert client.model == triton_server.model
            assert triton_server.model in {m.name for m in client.models() if m.ready}
        if key:  # the server restricts its repository index: discovery needs the key
            with Client(url, protocol=protocol, admin_key="wrong") as client:  # type: ignore[arg-type]
                with pytest.raises(ModelNotReady, match="TRITONFORGE_ADMIN_KEY"):
                    client.complete(PROMPT, max_tokens=2)
                with pytest.raises(Forbidden):
                    client.models()


def test_many_concurrent_streams_share_one_client(triton_server: Any, clients: dict[str, Client]) -> None:
    for protocol, client in clients.items():
        out: list[str] = []

        def one(client: Client = client, out: list[str] = out) -> None:
            out.append(client.complete(PROMPT, max_tokens=8).text)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(out) == 6 and len(set(out)) == 1, (protocol, out)

    async def many(protocol: str) -> list[str]:
        async with AsyncClient(_url(triton_server, protocol), protocol=protocol,  # type: ignore[arg-type]
                               model=triton_server.model) as client:
            done = await asyncio.gather(*[client.complete(PROMPT, max_tokens=8) for _ in range(6)])
            return [c.text for c in done]

    for protocol in PROTOCOLS:
        texts = asyncio.run(many(protocol))
        assert len(set(texts)) == 1, texts


def test_a_finished_grpc_stream_closes_with_the_servers_status_not_a_cancel(triton_server: Any) -> None:
    """After the final response the typed gRPC clients read the call to its end (status OK).
    A call left for grpc to cancel once the final response has arrived makes Triton 2.51's
    gRPC frontend keep that request, and with it the model, for ever: the server's stop then
    exits 1 (tests/test_reliability_drops.py stops a server after such streams)."""
    import grpc

    with Client(triton_server.grpc_url, model=triton_server.model) as client, \
            client.stream(PROMPT, max_tokens=4) as s:
        chunks = list(s)
        call = s._call._call  # the grpc call under the typed stream
        assert chunks and call.done() and call.code() is grpc.StatusCode.OK

    async def main() -> Any:
        async with AsyncClient(triton_server.grpc_url, model=triton_server.model) as client, \
                client.stream(PROMPT, max_tokens=4) as s:
            assert [c async for c in s]
            call = s._call._call
            return call.done(), await call.code()

    assert asyncio.run(main()) == (True, grpc.StatusCode.OK)


# ---------------------------------------------------------------------------- cancellation
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_leaving_a_stream_cancels_the_server_request(triton_server: Any, clients: dict[str, Client],
                                                     protocol: str) -> None:
    metrics = triton_server.metrics_url
    assert _wait_running(metrics, lambda v: v == 0, 120) == 0, "requests left over from before"
    with clients[protocol].stream(PROMPT, max_tokens=LONG, min_tokens=LONG) as s:
        for chunk in s:
            if chunk.index >= 2:
                break
        assert _wait_running(metrics, lambda v: v >= 1) >= 1, "the request is not running"
    assert _wait_running(metrics, lambda v: v == 0) == 0, "the engine still runs the request"
    with pytest.raises(StreamConsumed):
        next(iter(s))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cancelling_the_asyncio_task_cancels_the_server_request(triton_server: Any, protocol: str) -> None:
    metrics = triton_server.metrics_url

    async def main() -> None:
        async with AsyncClient(_url(triton_server, protocol), protocol=protocol,  # type: ignore[arg-type]
                               model=triton_server.model) as client:
            task = asyncio.create_task(client.complete(PROMPT, max_tokens=LONG, min_tokens=LONG))
            deadline = time.monotonic() + 60
            while _running(metrics) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert _running(metrics) >= 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    assert _wait_running(metrics, lambda v: v == 0, 120) == 0, "requests left over from before"
    asyncio.run(main())
    assert _wait_running(metrics, lambda v: v == 0) == 0, "the engine still runs the request"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_closing_from_another_thread_raises_cancelled(clients: dict[str, Client], protocol: str) -> None:
    stream = clients[protocol].stream(PROMPT, max_tokens=LONG, min_tokens=LONG)
    with pytest.raises(Cancelled), stream:
        for chunk in stream:
            if chunk.index == 1:
                threading.Timer(0.2, stream.close).start()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_close_between_two_reads_raises_cancelled(triton_server: Any, clients: dict[str, Client],
                                                     protocol: str) -> None:
    """The end state of the race above when the close lands between two reads (or while
    responses are already buffered): the next read raises Cancelled, it does not end the
    stream as if it had finished. Sync and asyncio; the server's running gauge is the oracle
    that the request was cancelled there."""
    metrics = triton_server.metrics_url
    assert _wait_running(metrics, lambda v: v == 0, 120) == 0, "requests left over from before"
    stream = clients[protocol].stream(PROMPT, max_tokens=LONG, min_tokens=LONG)
    with stream:
        assert next(stream).index == 0
        stream.close()
        with pytest.raises(Cancelled):
            next(stream)

    async def main() -> None:
        async with AsyncClient(_url(triton_server, protocol), protocol=protocol,  # type: ignore[arg-type]
                               model=triton_server.model) as client:
            astream = client.stream(PROMPT, max_tokens=LONG, min_tokens=LONG)
            async with astream:
                assert (await astream.__anext__()).index == 0
                await astream.aclose()
                with pytest.raises(Cancelled):
                    await astream.__anext__()

    asyncio.run(main())
    assert _wait_running(metrics, lambda v: v == 0) == 0, "the engine still runs a closed stream's request"


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_closed_port_is_server_unavailable(protocol: str) -> None:
    url = f"127.0.0.1:{_closed_port()}"
    with Client(url, protocol=protocol, model="m", connect_retries=1) as client:  # type: ignore[arg-type]
        with pytest.raises(ServerUnavailable):
            client.complete(PROMPT, max_tokens=4)
        with pytest.raises(ServerUnavailable):
            client.models()

    async def main() -> None:
        async with AsyncClient(url, protocol=protocol, model="m", connect_retries=0) as client:  # type: ignore[arg-type]
            await client.complete(PROMPT, max_tokens=4)

    with pytest.raises(ServerUnavailable):
        asyncio.run(main())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_model_is_model_not_ready(triton_server: Any, protocol: str) -> None:
    url = _url(triton_server, protocol)
    with Client(url, protocol=protocol, model="no_such_model") as client:  # type: ignore[arg-type]
        with pytest.raises(ModelNotReady, match="no_such_model"):
            client.complete(PROMPT, max_tokens=4)
        assert client.ready() is False

    async def main() -> None:
        async with AsyncClient(url, protocol=protocol, model="no_such_model") as client:  # type: ignore[arg-type]
            await client.complete(PROMPT, max_tokens=4)

    with pytest.raises(ModelNotReady):
        asyncio.run(main())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_invalid_max_tokens_client_side_and_server_side(triton_server: Any, protocol: str) -> None:
    url = _url(triton_server, protocol)
    with Client(url, protocol=protocol, model=triton_server.model) as client:  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest) as local:
            client.complete(PROMPT, max_tokens=0)
        assert local.value.server_message is None
        client.check_requests = False  # send what only the server can refuse
        with pytest.raises(InvalidRequest, match="max_tokens") as remote:
            client.complete(PROMPT, max_tokens=0)
        assert remote.value.server_message and "max_tokens" in remote.value.server_message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tiny_timeout_is_timeout(triton_server: Any, clients: dict[str, Client], protocol: str) -> None:
    client = clients[protocol]
    assert _wait_running(triton_server.metrics_url, lambda v: v == 0, 120) == 0
    for stream in (True, False):
        with pytest.raises(Timeout):
            client.complete(PROMPT, max_tokens=LONG, min_tokens=LONG, stream=stream, timeout=0.3)
    assert _wait_running(triton_server.metrics_url, lambda v: v == 0) == 0


# ---------------------------------------------------------------------------- CLI
def _cli(*args: str, input: str | None = None) -> Any:
    from tritonforge.cli import _register_all, app
    from tritonforge.runtime.server import RESTRICTED_API_KEY_ENV

    _register_all()
    # No key in the environment: the CLI finds the local server's key by itself.
    env: dict[str, str | None] = {RESTRICTED_API_KEY_ENV: None}
    return CliRunner().invoke(app, list(args), input=input, env=env)


def test_cli_complete_json_and_stream(triton_server: Any, clients: dict[str, Client]) -> None:
    expected = clients["grpc"].complete(PROMPT, max_tokens=12, temperature=0.0).text
    for protocol in PROTOCOLS:
        url = _url(triton_server, protocol)
        result = _cli("complete", PROMPT, "--protocol", protocol, "--url", url, "--max-tokens", "12",
                      "--temperature", "0", "--json")
        assert result.exit_code == 0, result.output
        obj = json.loads(result.stdout)
        assert obj["text"] == expected
        assert obj["completion_tokens"] > 0 and obj["ttft"] > 0 and obj["finish_reason"]
        streamed = _cli("complete", PROMPT, "-p", protocol, "-u", url, "-n", "12", "-t", "0")
        assert streamed.exit_code == 0 and streamed.stdout == expected + "\n"


def test_cli_chat_keeps_history_and_exits(triton_server: Any, vllm_oracle: Any) -> None:
    first, second = "What is the capital of France?", "And of Italy?"
    result = _cli("chat", "--url", triton_server.grpc_url, "--max-tokens", "12", "--temperature", "0",
                  "--json", input=f"{first}\n{second}\n/exit\n")
    assert result.exit_code == 0, result.output
    replies = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(replies) == 2
    # Each answer is vLLM's own greedy answer to the conversation so far: the second turn
    # carried the first question and the first answer.
    turn1 = [{"role": "user", "content": first}]
    assert replies[0]["text"] == vllm_oracle.generate(chat_prompt_ids(turn1), temperature=0, max_tokens=12)["text"]
    turn2 = [*turn1, {"role": "assistant", "content": replies[0]["text"]}, {"role": "user", "content": second}]
    assert replies[1]["text"] == vllm_oracle.generate(chat_prompt_ids(turn2), temperature=0, max_tokens=12)["text"]
    assert replies[1]["prompt_tokens"] == len(chat_prompt_ids(turn2))


def test_cli_failures_are_one_line(triton_server: Any) -> None:
    for args, code in (
        (("complete", "hi", "--url", triton_server.grpc_url, "--model", "no_such_model"), 1),
        (("complete", "hi", "--url", f"127.0.0.1:{_closed_port()}"), 1),
        (("complete", "hi", "--url", triton_server.grpc_url, "--max-tokens", "0"), 2),
    ):
        result = _cli(*args)
        assert result.exit_code == code, result.output
        assert "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error:")
