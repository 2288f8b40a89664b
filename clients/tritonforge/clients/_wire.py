"""Wire encoding and decoding of the ensemble contract, for both transports (no I/O).

gRPC: a request is one ``ModelInferRequest`` (sent on a ``ModelStreamInfer`` stream), every
input shaped ``[1, *dims]`` (the repository's models batch), BYTES in
``raw_input_contents`` as 4-byte little-endian length + bytes, numbers little-endian.
HTTP: a JSON body whose keys are input names (``generate_stream``), answered by SSE events
whose JSON data has the output names as keys.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from tritonforge import contract
from tritonforge.clients._models import TokenLogprob
from tritonforge.clients.exceptions import (
    Cancelled,
    EngineError,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    Overloaded,
    ProtocolError,
    ServerError,
    ServerUnavailable,
    TritonForgeError,
)

if TYPE_CHECKING:
    from tritonforge.clients._models import Request

__all__ = [
    "OUTPUT_FINISH",
    "OUTPUT_PROMPT_TOKENS",
    "OUTPUT_TEXT",
    "OUTPUT_TOKENS",
    "Event",
    "Status",
    "decode_bytes",
    "encode_bytes",
    "grpc_event",
    "grpc_request",
    "http_body",
    "server_error",
    "sse_event",
]

_IN: Final = contract.by_name(contract.ENSEMBLE_INPUTS)
_OUT: Final = contract.by_name(contract.ENSEMBLE_OUTPUTS)
OUTPUT_TEXT: Final = _OUT["text_output"].name
OUTPUT_FINISH: Final = _OUT["finish_reason"].name
OUTPUT_PROMPT_TOKENS: Final = _OUT["num_input_tokens"].name
OUTPUT_TOKENS: Final = _OUT["num_output_tokens"].name
OUTPUT_LOG_PROBS: Final = _OUT["output_log_probs"].name
OUTPUT_SEQUENCE: Final = _OUT["sequence_index"].name
OUTPUT_TOP_LOG_PROBS: Final = _OUT["output_top_log_probs"].name

# struct format letter per fixed-size wire type.
_STRUCT: Final[dict[str, str]] = {
    "BOOL": "?",
    "INT32": "i",
    "INT64": "q",
    "UINT64": "Q",
    "FP16": "e",
    "FP32": "f",
    "FP64": "d",
}


@dataclass(frozen=True)
class Event:
    """One decoded response of the ensemble (either transport)."""

    text: str
    tokens: int
    prompt_tokens: int | None
    finish_reason: contract.FinishReason
    final: bool
    logprobs: tuple[TokenLogprob, ...] = ()
    sequence: int = 0  # sequence_index: which of num_return_sequences (Request.n)


# ----------------------------------------------------------------------------------------
# Raw tensor bytes
def encode_bytes(items: list[bytes]) -> bytes:
    """Serialise BYTES elements: each as a 4-byte little-endian length, then the bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def decode_bytes(raw: bytes) -> list[bytes]:
    """Inverse of :func:`encode_bytes`; raises :class:`ProtocolError` on a truncated buffer."""
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ProtocolError("truncated BYTES tensor (length prefix cut short)")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ProtocolError("truncated BYTES tensor (element cut short)")
        out.append(raw[pos : pos + n])
        pos += n
    return out


def _elements(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _encode(wire_type: str, values: list[Any]) -> bytes:
    if wire_type == "BYTES":
        return encode_bytes([v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values])
    return struct.pack(f"<{len(values)}{_STRUCT[wire_type]}", *values)


def _decode(wire_type: str, raw: bytes) -> list[Any]:
    if wire_type == "BYTES":
        return decode_bytes(raw)
    letter = _STRUCT.get(wire_type)
    if letter is None:
        raise ProtocolError(f"unexpected output datatype {wire_type}")
    size = struct.calcsize(letter)
    if len(raw) % size:
        raise ProtocolError(f"{wire_type} tensor of {len(raw)} bytes is not a whole number of elements")
    return list(struct.unpack(f"<{len(raw) // size}{letter}", raw))


def _shape(tensor: contract.Tensor, count: int) -> list[int]:
    return [1, *(count if d == -1 else d for d in tensor.dims)]


# ----------------------------------------------------------------------------------------
# gRPC
def grpc_request(request: Request, model: str) -> Any:
    """The ``ModelInferRequest`` for one request (sent alone on a ``ModelStreamInfer`` call).

    The empty-final-response parameter is set, so the end of every stream is explicit.
    """
    from tritonclient.grpc import service_pb2  # type: ignore[import-untyped]

    msg = service_pb2.ModelInferRequest(model_name=model, id=request.request_id or "")
    for name, value in request.inputs().items():
        tensor = _IN[name]
        values = _elements(value)
        wire_type = tensor.dtype.wire
        msg.inputs.append(
            service_pb2.ModelInferRequest.InferInputTensor(
                name=name, datatype=wire_type, shape=_shape(tensor, len(values))
            )
        )
        msg.raw_input_contents.append(_encode(wire_type, values))
    msg.parameters[contract.ENABLE_EMPTY_FINAL_PARAMETER].bool_param = True
    return msg


def grpc_stop_request(engine: str, request_id: str) -> Any:
    """The request that cancels ``request_id`` on the engine model ``engine``
    (``contract.STOP_REQUEST``: Triton 2.51 ensembles do not forward a client's cancellation
    to a running step, so a client that leaves a stream early sends this)."""
    from tritonclient.grpc import service_pb2

    msg = service_pb2.ModelInferRequest(model_name=engine, id=request_id)
    for name, dtype, value in contract.STOP_REQUEST:
        msg.inputs.append(
            service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=dtype.wire, shape=[1, 1])
        )
        msg.raw_input_contents.append(_encode(dtype.wire, [value]))
    return msg


def http_stop_body(request_id: str) -> dict[str, Any]:
    """The ``generate_stream`` body that cancels ``request_id`` on the engine model."""
    body: dict[str, Any] = {name: ([value] if name == "input_ids" else value)
                            for name, _, value in contract.STOP_REQUEST}
    body["id"] = request_id
    return body


def engine_step(config: dict[str, Any]) -> str | None:
    """The engine step of an ensemble's config (JSON form), if it is a tritonforge engine."""
    engines = (contract.MODEL_VLLM_ENGINE, contract.MODEL_TENSORRT_LLM)
    if config.get("name") in engines:
        return str(config["name"])
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    for step in steps:
        name = step.get("model_name") if isinstance(step, dict) else None
        if name in engines:
            return str(name)
    return None


def lora_names(preprocessing_config: dict[str, Any]) -> list[str]:
    """The LoRA adapters a deployment serves by name: the keys of its preprocessing model's
    ``tritonforge_lora_adapters`` parameter (its config in JSON form)."""
    raw = ((preprocessing_config.get("parameters") or {}).get(contract.Param.LORA_ADAPTERS.value) or {})
    try:
        adapters = json.loads(raw.get("string_value") or "{}")
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{contract.Param.LORA_ADAPTERS.value} is not JSON") from exc
    return sorted(adapters) if isinstance(adapters, dict) else []


def _contents_values(datatype: str, contents: Any) -> list[Any]:
    field = {
        "BYTES": "bytes_contents", "BOOL": "bool_contents", "INT32": "int_contents",
        "INT64": "int64_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
        "FP64": "fp64_contents",
    }.get(datatype)
    if field is None:
        raise ProtocolError(f"unexpected output datatype {datatype}")
    return list(getattr(contents, field))


def grpc_is_final(stream_response: Any) -> bool:
    """Whether a ``ModelStreamInferResponse`` is its request's last (Triton's final flag)."""
    params = stream_response.infer_response.parameters
    return contract.FINAL_RESPONSE_PARAMETER in params and bool(
        params[contract.FINAL_RESPONSE_PARAMETER].bool_param)


def grpc_event(stream_response: Any, final: bool | None = None) -> Event:
    """Decode one ``ModelStreamInferResponse``; an ``error_message`` raises the typed error.
    ``final``: :func:`grpc_is_final` of it, when the caller has read that already."""
    if stream_response.error_message:
        raise server_error(stream_response.error_message)
    resp = stream_response.infer_response
    values: dict[str, list[Any]] = {}
    raw = resp.raw_output_contents
    for i, out in enumerate(resp.outputs):
        if i < len(raw):
            values[out.name] = _decode(out.datatype, raw[i])
        else:
            values[out.name] = _contents_values(out.datatype, out.contents)
    return _event(values, final=grpc_is_final(stream_response) if final is None else final)


# ----------------------------------------------------------------------------------------
# HTTP
def http_body(request: Request) -> dict[str, Any]:
    """The JSON body for ``POST /v2/models/<m>/generate_stream``: input names as keys."""
    body: dict[str, Any] = dict(request.inputs())
    if request.request_id:
        body["id"] = request.request_id
    return body


def sse_event(data: str) -> Event:
    """Decode one SSE event's data; an ``error`` key raises the typed error."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"SSE event is not JSON: {data[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"SSE event is not a JSON object: {data[:200]!r}")
    if "error" in obj:
        raise server_error(str(obj["error"]))
    values = {k: _elements(v) for k, v in obj.items() if k in _OUT}
    # HTTP has no final-response flag: the body ends after the last event.
    return _event(values, final=False)


# ----------------------------------------------------------------------------------------
def _text(v: Any) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def _event(values: dict[str, list[Any]], *, final: bool) -> Event:
    texts = values.get(OUTPUT_TEXT, [])
    text = "".join(_text(t) for t in texts)
    reason_raw = _text(values[OUTPUT_FINISH][0]) if values.get(OUTPUT_FINISH) else ""
    try:
        reason = contract.FinishReason(reason_raw)
    except ValueError as exc:
        raise ProtocolError(f"unknown finish_reason {reason_raw!r}") from exc
    tokens = values.get(OUTPUT_TOKENS)
    prompt = values.get(OUTPUT_PROMPT_TOKENS)
    if not values and not final:
        raise ProtocolError("a response carried none of the ensemble's outputs")
    return Event(
        text=text,
        tokens=int(tokens[0]) if tokens else 0,
        prompt_tokens=int(prompt[0]) if prompt else None,
        finish_reason=reason,
        final=final,
        logprobs=_logprobs(values),
        sequence=int(values[OUTPUT_SEQUENCE][0]) if values.get(OUTPUT_SEQUENCE) else 0,
    )


def _logprobs(values: dict[str, list[Any]]) -> tuple[TokenLogprob, ...]:
    """The tokens' log-probabilities of one response (``output_log_probs`` with the texts
    and alternatives of ``output_top_log_probs``); () when not asked for."""
    lps = values.get(OUTPUT_LOG_PROBS) or []
    raw = _text(values[OUTPUT_TOP_LOG_PROBS][0]) if values.get(OUTPUT_TOP_LOG_PROBS) else ""
    if not lps:
        return ()
    try:
        detail = json.loads(raw) if raw else []
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"{OUTPUT_TOP_LOG_PROBS} is not JSON: {raw[:200]!r}") from exc
    if len(detail) != len(lps):
        raise ProtocolError(f"{OUTPUT_LOG_PROBS} has {len(lps)} values for {len(detail)} tokens")
    return tuple(TokenLogprob(str(d["token"]), float(lp), tuple((str(t), float(v)) for t, v in d["top"]))
                 for lp, d in zip(lps, detail))


# The transport's status class where there is one (gRPC code / HTTP status); ``None``
# inside a stream (gRPC ``error_message``, an SSE ``error`` event), which carries none.
Status = Literal["invalid", "forbidden", "not_found", "unavailable", "internal", "cancelled"]

_BY_KIND: Final[dict[contract.ErrorKind, type[TritonForgeError]]] = {
    contract.ErrorKind.INVALID_REQUEST: InvalidRequest,
    contract.ErrorKind.OVERLOADED: Overloaded,
    contract.ErrorKind.CANCELLED: Cancelled,
    contract.ErrorKind.NOT_READY: ModelNotReady,
    contract.ErrorKind.ENGINE_FAILURE: EngineError,
    contract.ErrorKind.INTERNAL: ServerError,
}
_BY_STATUS: Final[dict[str, type[TritonForgeError]]] = {
    "invalid": InvalidRequest,
    "forbidden": Forbidden,
    "not_found": ModelNotReady,
    "unavailable": ServerUnavailable,
    "internal": ServerError,
    "cancelled": Cancelled,
}


def server_error(message: str, *, status: Status | None = None) -> TritonForgeError:
    """The typed error for a message the server sent: the one parser of error kinds.

    tritonforge's models tag every error with its kind (``contract.format_error``); that
    tag decides. An untagged error is Triton's own: the transport's ``status`` decides, and
    inside a stream (no status) it is a refused request -- Triton checks a request's inputs
    and model before any step runs (the clients tell an unknown model apart by asking the
    server whether it is ready).
    """
    text = message.strip() or "the server reported an error without a message"
    info = contract.parse_error(text)
    if info is not None:
        cls = _BY_KIND[info.kind]
        if cls is InvalidRequest:
            return InvalidRequest(info.message, server_message=info.message, kind=info.kind,
                                  param=info.param)
        return cls(info.message, kind=info.kind, param=info.param)
    cls = _BY_STATUS.get(status or "invalid", ServerError)
    if cls is InvalidRequest:
        return InvalidRequest(text, server_message=text)
    return cls(text)
