"""The clients' no-I/O layer: request validation, wire encoding/decoding, timings, discovery."""

from __future__ import annotations

import json
import struct
import time

import pytest
from tritonclient.grpc import service_pb2
from tritonforge import contract
from tritonforge.clients import (
    Cancelled,
    Chunk,
    Client,
    Completion,
    EngineError,
    FinishReason,
    InvalidRequest,
    ModelNotReady,
    Overloaded,
    ProtocolError,
    Request,
    ServerError,
    ServerUnavailable,
    Timeout,
    _wire,
)
from tritonforge.clients._base import Recorder, normalise_url, pick_ensemble
from tritonforge.clients._http import error_text, status_error
from tritonforge.clients._http import translate as translate_http


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "max_tokens": int(contract.param("max_tokens").high or 0) + 1}, "max_tokens"),
        ({"prompt": "hi", "min_p": -0.5}, "min_p"),
        ({"prompt": "hi", "max_tokens": 2.5}, "integer"),
        ({"prompt": "hi", "temperature": -0.1}, "temperature"),
        ({"prompt": "hi", "top_p": 0.0}, "top_p"),
        ({"prompt": "hi", "presence_penalty": 3.0}, "presence_penalty"),
        ({"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"prompt": "hi", "stop": ["ok", ""]}, "empty"),
        ({"prompt": "hi", "stop": "one string"}, "list of strings"),
        ({"prompt": "hi", "timeout": 0}, "timeout"),
        ({}, "exactly one"),
        ({"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, "exactly one"),
        ({"messages": []}, "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"prompt": "x" * (contract.LIMITS.max_prompt_bytes + 1)}, "bytes"),
    ],
)
def test_invalid_requests_are_refused_before_io(fields: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as info:
        Request(**fields).validate()  # type: ignore[arg-type]
    assert info.value.server_message is None


def test_client_validates_before_any_io() -> None:
    # Nothing listens on this port: validation must fail first, without a connection.
    client = Client("127.0.0.1:9", connect_retries=0)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        client.complete("hi", max_tokens=0)
    assert client._transport is None


def test_overrides_replace_and_none_clears() -> None:
    client = Client(model="m")
    base = Request(prompt="a", max_tokens=5, temperature=0.5)
    merged = client.build_request(base, {"max_tokens": 7, "temperature": None})
    assert (merged.max_tokens, merged.temperature, merged.prompt) == (7, None, "a")
    assert client.build_request("b", {"max_tokens": 3}) == Request(prompt="b", max_tokens=3)
    assert client.timeout_for(Request(prompt="a")) == client.timeout
    assert client.timeout_for(Request(prompt="a", timeout=None)) is None
    assert client.timeout_for(Request(prompt="a", timeout=2.0)) == 2.0


def test_urls() -> None:
    assert normalise_url(None, "grpc") == "127.0.0.1:8001"
    assert normalise_url(None, "http") == "http://127.0.0.1:8000"
    assert normalise_url("h:1", "http") == "http://h:1"
    assert normalise_url("http://h:1/", "http") == "http://h:1"
    with pytest.raises(InvalidRequest):
        normalise_url("http://h:1", "grpc")
    with pytest.raises(InvalidRequest):
        normalise_url("h:1", "smtp")


# ---------------------------------------------------------------------------- gRPC wire
def _inputs(msg: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], bytes]]:
    return {
        t.name: (t.datatype, list(t.shape), msg.raw_input_contents[i])
        for i, t in enumerate(msg.inputs)
    }


def test_grpc_request_encoding() -> None:
    req = Request(
        prompt="héllo", max_tokens=7, temperature=0.5, seed=2**63, stop=["\n\n", "END"],
        stream=False, request_id="r1",
    )
    msg = _wire.grpc_request(req, "ens")
    assert msg.model_name == "ens" and msg.id == "r1"
    assert msg.parameters[contract.ENABLE_EMPTY_FINAL_PARAMETER].bool_param is True
    got = _inputs(msg)
    assert got["text_input"] == ("BYTES", [1, 1], struct.pack("<I", 6) + "héllo".encode())
    assert got["max_tokens"] == ("INT32", [1, 1], struct.pack("<i", 7))
    assert got["temperature"] == ("FP32", [1, 1], struct.pack("<f", 0.5))
    assert got["seed"] == ("UINT64", [1, 1], struct.pack("<Q", 2**63))
    assert got["stream"] == ("BOOL", [1, 1], b"\x00")
    assert got["stop_words"] == ("BYTES", [1, 2], _wire.encode_bytes([b"\n\n", b"END"]))
    # Only what the request sets is sent; the server fills the rest from the spec.
    assert set(got) == {"text_input", "max_tokens", "temperature", "seed", "stop_words", "stream"}
    # Every dtype comes from the contract.
    inputs = contract.by_name(contract.ENSEMBLE_INPUTS)
    assert all(got[n][0] == inputs[n].dtype.wire for n in got)


def test_grpc_request_messages_json() -> None:
    msgs = [{"role": "user", "content": "Bonjour ✓"}]
    msg = _wire.grpc_request(Request(messages=msgs), "ens")
    raw = _inputs(msg)["messages"][2]
    (only,) = _wire.decode_bytes(raw)
    assert contract.parse_messages(only.decode()) == msgs


def test_bytes_roundtrip_and_truncation() -> None:
    items = [b"", b"a", "✓".encode(), b"x" * 300]
    assert _wire.decode_bytes(_wire.encode_bytes(items)) == items
    with pytest.raises(ProtocolError):
        _wire.decode_bytes(_wire.encode_bytes([b"abc"])[:-1])


def _stream_response(
    text: str | None, reason: str, n_in: int, n_out: int, *, final: bool, error: str = ""
) -> service_pb2.ModelStreamInferResponse:
    resp = service_pb2.ModelInferResponse(model_name="ens", id="r")
    if text is not None:
        for name, dtype, raw in (
            ("text_output", "BYTES", _wire.encode_bytes([text.encode()])),
            ("finish_reason", "BYTES", _wire.encode_bytes([reason.encode()])),
            ("num_input_tokens", "INT32", struct.pack("<i", n_in)),
            ("num_output_tokens", "INT32", struct.pack("<i", n_out)),
        ):
            resp.outputs.append(
                service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype=dtype, shape=[1, 1])
            )
            resp.raw_output_contents.append(raw)
    resp.parameters[contract.FINAL_RESPONSE_PARAMETER].bool_param = final
    return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=resp)


def test_grpc_response_decoding() -> None:
    ev = _wire.grpc_event(_stream_response(" Paris", "", 12, 2, final=False))
    assert ev == _wire.Event(" Paris", 2, 12, FinishReason.NONE, False)
    ev = _wire.grpc_event(_stream_response(".", "stop", 12, 1, final=True))
    assert (ev.finish_reason, ev.final) == (FinishReason.STOP, True)
    empty_final = _wire.grpc_event(_stream_response(None, "", 0, 0, final=True))
    assert (empty_final.text, empty_final.tokens, empty_final.final) == ("", 0, True)


def _tagged(kind: contract.ErrorKind, message: str, param: str | None = None) -> str:
    # as tritonforge's models write it, behind the prefix Triton's ensembles add
    return "in ensemble 'smollm2', " + contract.format_error(kind, message, param)


def test_grpc_error_message_in_stream_is_typed_by_its_tag() -> None:
    def raised(error: str) -> Exception:
        with pytest.raises(Exception) as info:
            _wire.grpc_event(_stream_response(None, "", 0, 0, final=True, error=error))
        return info.value

    err = raised(_tagged(contract.ErrorKind.INVALID_REQUEST, "max_tokens must be >= 1", "max_tokens"))
    assert isinstance(err, InvalidRequest) and err.param == "max_tokens"
    assert err.server_message == "max_tokens must be >= 1" and str(err) == "max_tokens must be >= 1"
    # an engine failure is not the request's fault, even though it reads "engine error: invalid ..."
    err = raised(_tagged(contract.ErrorKind.ENGINE_FAILURE, "engine error: invalid state"))
    assert isinstance(err, EngineError) and isinstance(err, ServerError)
    assert isinstance(raised(_tagged(contract.ErrorKind.INTERNAL, "postprocessing failed: boom")), ServerError)
    assert isinstance(raised(_tagged(contract.ErrorKind.OVERLOADED, "queue full")), Overloaded)
    assert isinstance(raised(_tagged(contract.ErrorKind.NOT_READY, "engine is gone")), ModelNotReady)
    assert isinstance(raised(_tagged(contract.ErrorKind.CANCELLED, "request cancelled")), Cancelled)
    # Triton's own (untagged) in-stream errors are refusals; the client asks the server
    # whether the model is ready to tell an unknown model apart (see test_clients_server)
    err = raised("Request for unknown model: 'x' is not found")
    assert isinstance(err, InvalidRequest) and err.kind is None


def test_grpc_bad_finish_reason_is_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="finish_reason"):
        _wire.grpc_event(_stream_response("a", "exploded", 1, 1, final=True))


# ---------------------------------------------------------------------------- HTTP wire
def test_http_body() -> None:
    body = _wire.http_body(
        Request(messages=[{"role": "user", "content": "hi"}], max_tokens=3, stop=["a"], request_id="q")
    )
    assert body == {
        "messages": json.dumps([{"role": "user", "content": "hi"}]),
        "max_tokens": 3,
        "stop_words": ["a"],
        "stream": True,
        "id": "q",
    }


def test_sse_decoding() -> None:
    ev = _wire.sse_event(
        json.dumps({"model_name": "ens", "text_output": " hi", "finish_reason": "length",
                    "num_input_tokens": 4, "num_output_tokens": 1})
    )
    assert ev == _wire.Event(" hi", 1, 4, FinishReason.LENGTH, False)
    listed = _wire.sse_event(json.dumps({"text_output": ["a", "b"], "num_output_tokens": [2]}))
    assert (listed.text, listed.tokens) == ("ab", 2)
    with pytest.raises(InvalidRequest, match="top_p"):
        _wire.sse_event(json.dumps({"error": "top_p must be in (0, 1]"}))
    # the Python backend's own failure (seen in CI when a stub missed its health deadline):
    # the server failed, the request was fine
    with pytest.raises(ServerError, match="not healthy") as failed:
        _wire.sse_event(json.dumps({"error": "in ensemble 'smollm2', Stub process "
                                             "'postprocessing_0_0' is not healthy."}))
    assert not isinstance(failed.value, InvalidRequest)
    with pytest.raises(ProtocolError):
        _wire.sse_event("not json")
    with pytest.raises(ProtocolError):
        _wire.sse_event(json.dumps({"unrelated": 1}))


def test_http_status_errors() -> None:
    err = status_error(404, error_text('{"error":"Request for unknown model: \'nope\' is not found"}'))
    assert isinstance(err, ModelNotReady)
    tagged = contract.format_error(contract.ErrorKind.INVALID_REQUEST, "max_tokens must be an integer in [1, 9]",
                                   "max_tokens")
    err = status_error(400, error_text(json.dumps({"error": tagged})))
    assert isinstance(err, InvalidRequest) and err.server_message == "max_tokens must be an integer in [1, 9]"
    assert err.param == "max_tokens"
    engine = contract.format_error(contract.ErrorKind.ENGINE_FAILURE, "engine error: boom")
    assert isinstance(status_error(400, engine), EngineError)  # the tag wins over the status
    assert isinstance(status_error(503, "going away"), ServerUnavailable)
    assert isinstance(status_error(500, "boom"), ServerError)


def test_httpx_errors_translate() -> None:
    import httpx

    assert isinstance(translate_http(httpx.ConnectError("refused")), ServerUnavailable)
    assert isinstance(translate_http(httpx.ReadTimeout("slow")), Timeout)
    assert isinstance(translate_http(httpx.RemoteProtocolError("cut")), ServerUnavailable)


# ---------------------------------------------------------------------------- timings
def test_recorder_timings_follow_genai_perf() -> None:
    rec = Recorder("ens", Request(prompt="x"), timeout=None)
    chunks: list[Chunk | None] = []
    for text, n, reason, final in ((" a", 1, "", False), (" b c", 2, "", False),
                                   (" d", 1, "length", False), ("", 0, "", True)):
        time.sleep(0.01)
        chunks.append(rec.add(_wire.Event(text, n, 5, FinishReason(reason), final)))
    assert chunks[-1] is None  # the empty final response is not a chunk
    assert [c.index for c in chunks if c] == [0, 1, 2]
    assert chunks[2] is not None and chunks[2].finish_reason is FinishReason.LENGTH
    done: Completion = rec.finish()
    assert (done.text, done.completion_tokens, done.prompt_tokens) == (" a b c d", 4, 5)
    assert done.finish_reason is FinishReason.LENGTH and done.chunks == 3
    assert done.ttft is not None and 0 < done.ttft < done.latency
    assert len(done.inter_token_latencies) == 2
    assert done.itl == pytest.approx((done.latency - done.ttft) / 3)
    assert json.loads(json.dumps(done.to_dict()))["finish_reason"] == "length"


def test_recorder_deadline() -> None:
    rec = Recorder("ens", Request(prompt="x"), timeout=0.01)
    time.sleep(0.02)
    with pytest.raises(Timeout):
        rec.check_deadline()


# ---------------------------------------------------------------------------- discovery
def test_pick_ensemble() -> None:
    assert pick_ensemble({"llm": "ensemble", "preprocessing": "", "vllm_engine": ""}) == "llm"
    assert pick_ensemble({"llm": "ensemble", "llm_sync": "ensemble"}) == "llm"
    with pytest.raises(ModelNotReady, match="a, b"):
        pick_ensemble({"a": "ensemble", "b": "ensemble"})
    with pytest.raises(ModelNotReady, match="preprocessing"):
        pick_ensemble({"preprocessing": ""})
