"""Malformed requests over the real server, on the raw wire (no client-side validation).

Every case is sent three ways where the wire can carry it:

* gRPC ``ModelStreamInfer`` to the decoupled ensemble (the error arrives in the stream's
  ``error_message``: gRPC streams carry no per-response status code);
* gRPC ``ModelInfer`` to the non-decoupled ``<name>_sync`` twin: status INVALID_ARGUMENT;
* HTTP ``POST /v2/models/<ensemble>/generate_stream`` with a raw JSON body: HTTP 400 with
  the error as an SSE event.

Each must be refused with its own specific message; afterwards the server is still ready
and a valid request succeeds. The 10 MB prompt reaches the server (Triton accepts gRPC
messages up to 2 GB) and is refused by preprocessing with the byte limit in the message.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from tritonforge import contract

pytestmark = pytest.mark.server

_IN = contract.by_name(contract.ENSEMBLE_INPUTS)
PROMPT = b"Once upon a time"
_FMT = {"INT32": "i", "INT64": "q", "UINT64": "Q", "FP32": "f", "BOOL": "?"}
TRIED: dict[str, int] = {"grpc_stream": 0, "grpc_unary": 0, "http": 0}


def _bytes(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


@dataclass(frozen=True)
class Wire:
    """One input tensor as it goes on the gRPC wire."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    raw: bytes


def text(value: bytes, name: str = "text_input") -> Wire:
    return Wire(name, "BYTES", (1, 1), _bytes(value))


def words(name: str, *items: bytes) -> Wire:
    return Wire(name, "BYTES", (1, len(items)), _bytes(*items))


def num(name: str, value: float, datatype: str | None = None) -> Wire:
    dt = datatype or _IN[name].dtype.wire
    return Wire(name, dt, (1, 1), struct.pack("<" + _FMT[dt], value))


@dataclass(frozen=True)
class Case:
    id: str
    grpc: list[Wire]
    http: dict[str, Any] | None  # None: JSON cannot carry it (raw bytes, NaN, dtypes)
    message: str  # regex the server's message must match
    unary: bool = True  # also through ModelInfer on the _sync model
    params: dict[str, Any] = field(default_factory=dict)  # gRPC request parameters
    triton: bool = False  # refused by Triton itself (untagged), not by a tritonforge model


def _messages(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _msg_case(id: str, value: Any, message: str) -> Case:
    raw = _messages(value)
    return Case(id, [text(raw.encode(), "messages"), num("max_tokens", 2)],
                {"messages": raw, "max_tokens": 2}, message)


LONG_PROMPT = "hello " * 3000  # ~3,000 tokens: more than the 2,048-token context
TEN_MB = b"x" * (10 * 1024 * 1024)
CASES: list[Case] = [
    Case("empty-prompt", [text(b""), num("max_tokens", 2)], {"text_input": "", "max_tokens": 2},
         r"text_input is empty; send a non-empty prompt"),
    Case("missing-prompt", [num("max_tokens", 2)], {"max_tokens": 2},
         r"text_input is required \(or messages"),
    Case("whitespace-messages-no-prompt", [text(b"   ", "messages")], {"messages": "   "},
         r"text_input is required"),
    Case("prompt-wrong-dtype", [Wire("text_input", "INT32", (1, 1), struct.pack("<i", 3))], None,
         r"input 'text_input' data-type is 'INT32', but model '[^']+' expects 'BYTES'", triton=True),
    Case("max-tokens-wrong-dtype", [text(PROMPT), num("max_tokens", 2.0, "FP32")], None,
         r"input 'max_tokens' data-type is 'FP32', but model '[^']+' expects 'INT32'", triton=True),
    Case("temperature-wrong-dtype", [text(PROMPT), num("temperature", 1, "INT32")], None,
         r"input 'temperature' data-type is 'INT32', but model '[^']+' expects 'FP32'", triton=True),
    Case("stop-words-wrong-dtype", [text(PROMPT), Wire("stop_words", "INT32", (1, 1), struct.pack("<i", 7))],
         None, r"input 'stop_words' data-type is 'INT32', but model '[^']+' expects 'BYTES'", triton=True),
    Case("max-tokens-zero", [text(PROMPT), num("max_tokens", 0)], {"text_input": "hi", "max_tokens": 0},
         r"max_tokens must be an integer in \[1, 1048576\]; got 0"),
    Case("max-tokens-negative", [text(PROMPT), num("max_tokens", -5)], {"text_input": "hi", "max_tokens": -5},
         r"max_tokens must be an integer in \[1, 1048576\]; got -5"),
    Case("max-tokens-huge", [text(PROMPT), num("max_tokens", 2_000_000_000)],
         {"text_input": "hi", "max_tokens": 2_000_000_000},
         r"max_tokens must be an integer in \[1, 1048576\]; got 2000000000"),
    Case("max-tokens-beyond-context", [text(PROMPT), num("max_tokens", 5000)],
         {"text_input": "hi", "max_tokens": 5000},
         r"max_tokens \(5000\) \+ the prompt \(\d+ tokens\) exceeds the model's context of 2048 tokens: "
         r"lower max_tokens to at most \d+"),
    Case("prompt-longer-than-context", [text(LONG_PROMPT.encode()), num("max_tokens", 2)],
         {"text_input": LONG_PROMPT, "max_tokens": 2},
         r"the prompt is \d+ tokens; the model's context is 2048 tokens, leaving no room to generate"),
    Case("prompt-10MB", [text(TEN_MB), num("max_tokens", 2)], {"text_input": TEN_MB.decode(), "max_tokens": 2},
         r"text_input is 10485760 bytes; at most 1048576 bytes are allowed"),
    Case("prompt-invalid-utf8", [text(b"caf\xc3\x28 \xff\xfe"), num("max_tokens", 2)], None,
         r"text_input is not valid UTF-8 \(byte 3\): send UTF-8 text"),
    Case("temperature-negative", [text(PROMPT), num("temperature", -1.0)],
         {"text_input": "hi", "temperature": -1.0}, r"temperature must be a number in \[0, 10\]; got -1.0"),
    Case("temperature-absurd", [text(PROMPT), num("temperature", 1e9)],
         {"text_input": "hi", "temperature": 1e9}, r"temperature must be a number in \[0, 10\]; got 1000000000.0"),
    Case("temperature-nan", [text(PROMPT), num("temperature", math.nan)], None,
         r"temperature must be a finite number; got nan"),
    Case("top-p-zero", [text(PROMPT), num("top_p", 0.0)], {"text_input": "hi", "top_p": 0.0},
         r"top_p must be a number in \(0, 1\]; got 0.0"),
    Case("top-p-above-one", [text(PROMPT), num("top_p", 1.5)], {"text_input": "hi", "top_p": 1.5},
         r"top_p must be a number in \(0, 1\]; got 1.5"),
    Case("top-k-negative", [text(PROMPT), num("top_k", -1)], {"text_input": "hi", "top_k": -1},
         r"top_k must be an integer in \[0, 1000000\] \(0 disables it\); got -1"),
    Case("repetition-penalty-zero", [text(PROMPT), num("repetition_penalty", 0.0)],
         {"text_input": "hi", "repetition_penalty": 0.0}, r"repetition_penalty must be a number in \(0, 10\]; got 0.0"),
    Case("presence-penalty-out-of-range", [text(PROMPT), num("presence_penalty", 5.0)],
         {"text_input": "hi", "presence_penalty": 5.0}, r"presence_penalty must be a number in \[-2, 2\]; got 5.0"),
    Case("frequency-penalty-infinite", [text(PROMPT), num("frequency_penalty", -math.inf)], None,
         r"frequency_penalty must be a finite number; got -inf"),
    Case("length-penalty-nan", [text(PROMPT), num("length_penalty", math.nan)], None,
         r"length_penalty must be a finite number; got nan"),
    Case("min-tokens-above-max-tokens", [text(PROMPT), num("max_tokens", 5), num("min_tokens", 10)],
         {"text_input": "hi", "max_tokens": 5, "min_tokens": 10}, r"min_tokens must be <= max_tokens \(5\); got 10"),
    Case("beam-width-zero", [text(PROMPT), num("beam_width", 0)], {"text_input": "hi", "beam_width": 0},
         r"beam_width must be an integer in \[1, 64\]; got 0"),
    Case("end-id-negative", [text(PROMPT), num("end_id", -1), num("max_tokens", 2)],
         {"text_input": "hi", "end_id": -1, "max_tokens": 2}, r"end_id must be an integer in \[0, 2147483647\]; got -1"),
    Case("pad-id-beyond-vocab", [text(PROMPT), num("pad_id", 10**9), num("max_tokens", 2)],
         {"text_input": "hi", "pad_id": 10**9, "max_tokens": 2},
         r"pad_id must be a token id in \[0, \d+\); got 1000000000"),
    Case("too-many-stop-words", [text(PROMPT), words("stop_words", *[f"w{i}".encode() for i in range(33)])],
         {"text_input": "hi", "stop_words": [f"w{i}" for i in range(33)]},
         r"stop_words must have at most 32 words; got 33"),
    Case("stop-word-too-long", [text(PROMPT), words("stop_words", b"y" * 2000)],
         {"text_input": "hi", "stop_words": ["y" * 2000]}, r"stop_words: each word must be at most 1024 bytes"),
    Case("stop-word-invalid-utf8", [text(PROMPT), words("stop_words", b"ok", b"\xff")], None,
         r"stop_words contains a word that is not valid UTF-8"),
    Case("too-many-bad-words", [text(PROMPT), words("bad_words", *[f"b{i}".encode() for i in range(40)])],
         {"text_input": "hi", "bad_words": [f"b{i}" for i in range(40)]}, r"bad_words must have at most 32 words; got 40"),
    _msg_case("messages-not-json", "{not json", r"messages must be a JSON list of \{role, content\} objects: "
              r"Expecting property name"),
    _msg_case("messages-object-not-list", {"role": "user", "content": "hi"},
              r"messages must be a non-empty JSON list of \{role, content\} objects"),
    _msg_case("messages-empty-list", [], r"messages must be a non-empty JSON list"),
    _msg_case("messages-item-not-object", ["hi"], r"messages\[0\] must be an object with 'role' and 'content'"),
    _msg_case("messages-bad-role", [{"role": "wizard", "content": "hi"}],
              r"messages\[0\]\.role must be one of system, user, assistant, tool; got 'wizard'"),
    _msg_case("messages-content-not-string", [{"role": "user", "content": 5}],
              r"messages\[0\]\.content must be a string"),
    _msg_case("messages-unknown-key", [{"role": "user", "content": "hi", "script": "x"}],
              r"messages\[0\] has unknown keys: script"),
    _msg_case("messages-too-many", [{"role": "user", "content": "a"}] * 1025,
              r"messages has 1025 entries; at most 1024 are allowed"),
    Case("messages-invalid-utf8", [text(b'[{"role": "user", "content": "\xff"}]', "messages")], None,
         r"messages is not valid UTF-8 \(byte \d+\)"),
    Case("both-prompt-and-messages",
         [text(PROMPT), text(b'[{"role": "user", "content": "hi"}]', "messages")],
         {"text_input": "hi", "messages": '[{"role": "user", "content": "hi"}]'},
         r"send either text_input or messages, not both"),
    Case("batch-of-two", [Wire("text_input", "BYTES", (2, 1), _bytes(b"a", b"b"))], None,
         r"text_input has batch size 2; send one prompt per request"),
    Case("wrong-shape", [Wire("text_input", "BYTES", (1, 2), _bytes(b"a", b"b"))], None,
         r"unexpected shape for input 'text_input' for model '[^']+'\. Expected \[-1,1\], got \[1,2\]", triton=True),
    Case("unknown-input", [text(PROMPT), num("max_tokens", 2), Wire("foo", "INT32", (1, 1), b"\0" * 4)], None,
         r"unexpected inference input 'foo' for model", triton=True),
    Case("min-p-out-of-range", [text(PROMPT), num("min_p", 1.5)], {"text_input": "hi", "min_p": 1.5},
         r"min_p must be a number in \[0, 1\]; got 1.5"),
    Case("beam-search-on-vllm", [text(PROMPT), num("beam_width", 2)], {"text_input": "hi", "beam_width": 2},
         r"beam_width is not supported by this deployment's engine \(vllm\)"),
    Case("misspelt-parameter", [text(PROMPT), num("max_tokens", 2)],
         {"text_input": "hi", "max_tokens": 2, "temprature": 0.5},
         r"temprature is not an input of this model; did you mean temperature\?",
         params={"temprature": 0.5}),
    Case("unknown-parameter", [text(PROMPT), num("max_tokens", 2)],
         {"text_input": "hi", "max_tokens": 2, "min_pp": 7}, r"min_pp is not an input of this model",
         params={"min_pp": 7}),
    Case("unknown-lora", [text(PROMPT), text(b"nope", "lora_name"), num("max_tokens", 2)],
         {"text_input": "hi", "lora_name": "nope", "max_tokens": 2},
         r"lora_name 'nope' is not a LoRA adapter of this model \(none are configured\)"),
]


# ------------------------------------------------------------------------------- the wire
def _infer_request(model: str, wires: list[Wire], request_id: str,
                   params: dict[str, Any] | None = None) -> Any:
    from tritonclient.grpc import service_pb2 as pb

    msg = pb.ModelInferRequest(model_name=model, id=request_id)
    for key, value in (params or {}).items():
        if isinstance(value, float):
            msg.parameters[key].double_param = value
        elif isinstance(value, int):
            msg.parameters[key].int64_param = value
        else:
            msg.parameters[key].string_param = str(value)
    for w in wires:
        msg.inputs.append(pb.ModelInferRequest.InferInputTensor(name=w.name, datatype=w.datatype, shape=list(w.shape)))
        msg.raw_input_contents.append(w.raw)
    msg.parameters[contract.ENABLE_EMPTY_FINAL_PARAMETER].bool_param = True
    return msg


@pytest.fixture(scope="module")
def stub(triton_server: Any) -> Iterator[Any]:
    from tritonclient.grpc import service_pb2_grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(triton_server.grpc_url, options=options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_stream(stub: Any, model: str, wires: list[Wire],
                params: dict[str, Any] | None = None) -> tuple[str | None, int]:
    """Send on ModelStreamInfer; return (the error message or None, responses seen)."""
    seen = 0
    for reply in stub.ModelStreamInfer(iter([_infer_request(model, wires, "malformed", params)]), timeout=120):
        seen += 1
        if reply.error_message:
            return str(reply.error_message), seen
        if reply.infer_response.parameters[contract.FINAL_RESPONSE_PARAMETER].bool_param:
            break
    return None, seen


def grpc_unary(stub: Any, model: str, wires: list[Wire],
               params: dict[str, Any] | None = None) -> tuple[grpc.StatusCode, str]:
    try:
        stub.ModelInfer(_infer_request(model, wires, "malformed", params), timeout=120)
    except grpc.RpcError as exc:
        return exc.code(), str(exc.details())
    return grpc.StatusCode.OK, ""


def http_stream(url: str, model: str, body: dict[str, Any] | bytes) -> tuple[int, str]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(f"http://{url}/v2/models/{model}/generate_stream", content=content, timeout=120)
    messages = []
    for line in reply.text.splitlines():
        payload = line[len("data:"):].strip() if line.startswith("data:") else line.strip()
        if not payload:
            continue
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "error" in obj:
            messages.append(str(obj["error"]))
    return reply.status_code, "; ".join(messages)


# ------------------------------------------------------------------------------- the tests
def test_at_least_thirty_distinct_cases() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_request_is_invalid_arg_with_a_specific_message(
    triton_server: Any, stub: Any, case: Case
) -> None:
    model = triton_server.model

    def tagged(message: str) -> None:
        """tritonforge's refusals carry their kind machine-readably (contract.parse_error)."""
        info = contract.parse_error(message)
        if case.triton:
            assert info is None, f"{case.id}: {message!r}"
        else:
            assert info is not None and info.kind is contract.ErrorKind.INVALID_REQUEST, f"{case.id}: {message!r}"

    message, _ = grpc_stream(stub, model, case.grpc, case.params)
    TRIED["grpc_stream"] += 1
    assert message is not None, f"{case.id}: the server accepted the request"
    assert re.search(case.message, message), f"{case.id}: {message!r}"
    tagged(message)
    if case.unary:
        code, details = grpc_unary(stub, model + "_sync", case.grpc, case.params)
        TRIED["grpc_unary"] += 1
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{case.id}: {code} {details!r}"
        assert re.search(case.message, details), f"{case.id}: {details!r}"
        tagged(details)
    if case.http is not None:
        status, error = http_stream(triton_server.http_url, model, case.http)
        TRIED["http"] += 1
        assert status == 400, f"{case.id}: HTTP {status} {error!r}"
        assert re.search(case.message, error), f"{case.id}: {error!r}"
        tagged(error)


def test_http_body_the_frontend_cannot_parse_is_refused_and_harmless(triton_server: Any) -> None:
    """Bodies Triton's HTTP frontend rejects before any model runs. It answers them with
    its own message (and, being Triton's code, status 400 or 500); none reaches a model."""
    url, model = triton_server.http_url, triton_server.model
    cases: list[tuple[bytes, str]] = [
        (b"{not json", r"failed to parse the request JSON buffer"),
        (json.dumps({"text_input": 3, "max_tokens": 2}).encode(), r"Unable to parse .*non-string as string"),
        (json.dumps({"text_input": "hi", "max_tokens": "ten"}).encode(),
         r"Unable to parse 'data': attempt to access JSON non-signed-integer"),
        (b'{"text_input": "caf\xc3\x28", "max_tokens": 2}', r"text_input is not valid UTF-8"),
    ]
    for body, pattern in cases:
        status, error = http_stream(url, model, body)
        TRIED["http"] += 1
        assert status in (400, 500), (body[:40], status)
        assert re.search(pattern, error), (body[:40], error)


def test_modelinfer_and_generate_on_the_decoupled_ensemble_are_refused(triton_server: Any, stub: Any) -> None:
    wires = [text(PROMPT), num("max_tokens", 2)]
    code, details = grpc_unary(stub, triton_server.model, wires)
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert "doesn't support models with decoupled transaction policy" in details
    reply = httpx.post(f"http://{triton_server.http_url}/v2/models/{triton_server.model}/generate",
                       json={"text_input": "hi", "max_tokens": 2}, timeout=60)
    assert "generate expects model to produce exactly 1 response" in reply.text


def test_server_is_ready_and_serves_after_the_malformed_requests(triton_server: Any, stub: Any) -> None:
    from tritonforge.clients import Client

    ready = httpx.get(f"http://{triton_server.http_url}/v2/health/ready", timeout=10)
    assert ready.status_code == 200
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with Client(url, protocol=protocol, model=triton_server.model) as client:  # type: ignore[arg-type]
            done = client.complete(PROMPT.decode(), max_tokens=6, temperature=0.0)
            assert done.text.strip() and done.completion_tokens > 0
    message, seen = grpc_stream(stub, triton_server.model, [text(PROMPT), num("max_tokens", 4)])
    assert message is None and seen >= 2
    code, _ = grpc_unary(stub, triton_server.model + "_sync", [text(PROMPT), num("max_tokens", 4)])
    assert code == grpc.StatusCode.OK
    total = sum(TRIED.values())
    print(f"\nmalformed requests tried: {total} ({len(CASES)} cases; gRPC stream {TRIED['grpc_stream']}, "
          f"gRPC unary {TRIED['grpc_unary']}, HTTP {TRIED['http']}); server ready afterwards")
