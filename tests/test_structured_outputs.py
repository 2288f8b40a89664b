"""Structured outputs through the real server (bundled tritonserver + vLLM + SmolLM2, CPU):
a JSON schema, a regex and a choice list, sampled at temperature 1, over gRPC, HTTP SSE and
the OpenAI gateway (official ``openai`` SDK). Judged by independent oracles -- the
``jsonschema`` validator, ``re.fullmatch``, list membership -- on the same prompts and seeds
with and without the guide; bad guides are refused naming the field, and the server keeps
serving."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from tritonforge.clients import AsyncClient, Client, InvalidRequest, Request
from tritonforge.gateway import GatewayHandle, run_gateway_in_thread

pytestmark = pytest.mark.server

N = 20  # samples per case, with and without the guide
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON = [{"role": "user", "content": "Describe a person: give their name and their age."}]
PHONE = r"[0-9]{3}-[0-9]{4}"
COLORS = ["red", "green", "blue"]


def _texts(server: Any, protocol: str, requests: list[Request]) -> list[str]:
    """The requests sent at once (the engine batches them); their texts, in order."""
    url = server.grpc_url if protocol == "grpc" else server.http_url

    async def run() -> list[str]:
        async with AsyncClient(url, protocol=protocol, model=server.model) as client:
            done = await asyncio.gather(*(client.complete(r) for r in requests))
        return [c.text for c in done]

    return asyncio.run(run())


def _person_valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _judge(what: str, guided: list[str], free: list[str], ok: Callable[[str], bool]) -> None:
    bad = [t for t in guided if not ok(t)]
    free_ok = sum(ok(t) for t in free)
    print(f"\n{what}: guided {len(guided) - len(bad)}/{len(guided)} valid, unguided {free_ok}/{len(free)};"
          f" e.g. {guided[0]!r} vs {free[0]!r}")
    assert not bad, f"{what}: guided outputs that break the guide: {bad}"
    assert free_ok <= len(free) // 4, f"{what}: the guide made no difference ({free_ok}/{len(free)} valid without it)"


@pytest.fixture(scope="module")
def sdk(triton_server: Any) -> Iterator[openai.OpenAI]:
    handle: GatewayHandle
    with run_gateway_in_thread(triton_server.grpc_url, triton_server.model) as handle, \
            openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def test_json_schema_every_sample_validates_over_grpc(triton_server: Any) -> None:
    base = Request(messages=PERSON, temperature=1.0, max_tokens=40)
    guided = _texts(triton_server, "grpc", [base.replace(json_schema=PERSON_SCHEMA, seed=i) for i in range(N)])
    free = _texts(triton_server, "grpc", [base.replace(seed=i) for i in range(N)])
    _judge("json_schema", guided, free, _person_valid)


def test_regex_every_sample_matches_over_http_sse(triton_server: Any) -> None:
    base = Request(prompt="Call me at my phone number,", temperature=1.0, max_tokens=12)
    guided = _texts(triton_server, "http", [base.replace(regex=PHONE, seed=i) for i in range(N)])
    free = _texts(triton_server, "http", [base.replace(seed=i) for i in range(N)])
    _judge("regex", guided, free, lambda t: re.fullmatch(PHONE, t) is not None)


def test_choice_and_response_format_through_the_openai_sdk(sdk: openai.OpenAI, triton_server: Any) -> None:
    chat = [{"role": "user", "content": "Pick a color for my car."}]

    def ask(seed: int, **extra: Any) -> str:
        reply = sdk.chat.completions.create(model=triton_server.model, messages=chat,  # type: ignore[arg-type]
                                            temperature=1.0, max_tokens=10, seed=seed, **extra)
        return reply.choices[0].message.content or ""

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}

    def streamed(seed: int) -> str:  # response_format json_schema, streamed: the deltas join
        stream = sdk.chat.completions.create(model=triton_server.model, messages=PERSON,  # type: ignore[arg-type]
                                             temperature=1.0, max_tokens=40, seed=seed, response_format=fmt,
                                             stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(N) as pool:  # concurrent, so the engine batches them
        guided = list(pool.map(lambda i: ask(i, extra_body={"guided_choice": COLORS}), range(N)))
        free = list(pool.map(ask, range(N)))
        formatted = list(pool.map(streamed, range(3)))
    _judge("choice", guided, free, lambda t: t in COLORS)
    assert all(_person_valid(t) for t in formatted), formatted


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("regex", "([0-9]", "not a valid regex"),
    ("json_schema", {"type": "strin"}, "not a valid json_schema"),
    ("grammar", 'start ::= "a"', "not a valid ebnf_grammar"),
    ("choice", [], "JSON list of non-empty strings"),
])
def test_bad_guides_are_refused_and_the_server_keeps_serving(triton_server: Any, field: str, value: Any,
                                                             fragment: str) -> None:
    with Client(triton_server.grpc_url, model=triton_server.model, check_requests=False) as client:
        with pytest.raises(InvalidRequest, match=re.escape(fragment)) as err:
            client.complete(Request(prompt="Hi", max_tokens=4, **{field: value}))
        assert err.value.param == "guided_decoding_guide"
        assert client.complete(Request(prompt="Hi", max_tokens=4, regex="[a-z]+")).text


def test_bad_guides_through_the_gateway_name_the_openai_field(sdk: openai.OpenAI, triton_server: Any) -> None:
    chat = [{"role": "user", "content": "Hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format"),
        ({"extra_body": {"guided_regex": "([0-9]"}}, "guided_regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "extra_body": {"guided_choice": ["a"]}}, "guided_choice"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model=triton_server.model, messages=chat, max_tokens=4,  # type: ignore[arg-type]
                                        **extra)
        assert err.value.status_code == 400 and err.value.param == param, (extra, err.value.body)
    ok = sdk.chat.completions.create(model=triton_server.model, messages=chat, max_tokens=4,  # type: ignore[arg-type]
                                     extra_body={"guided_regex": "[a-z]+"})
    assert re.fullmatch("[a-z]+", ok.choices[0].message.content or "")
