"""gRPC transports: the generated stub on one shared channel (sync and asyncio).

Each request is its own bidirectional ``ModelStreamInfer`` call carrying one request, so
any number of concurrent streams share one channel, and the sync transport runs in
gevent greenlets (after ``grpc.experimental.gevent.init_gevent()``): no helper threads or
queues, unlike tritonclient's ``start_stream`` API. Cancelling a call cancels the request
on the server. ``grpc.RpcError`` is translated in :func:`translate` only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, TypeVar

import grpc
import grpc.aio
from tritonforge.clients import _wire
from tritonforge.clients._base import ModelInfo
from tritonforge.clients.exceptions import ModelNotReady, ServerError, Timeout, TritonForgeError

__all__ = ["AsyncGrpcCall", "AsyncGrpcTransport", "GrpcCall", "GrpcTransport", "translate"]

_OPTIONS: Final = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # Reconnect quickly after a refused connection so connect retries can succeed.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # gRPC shares subchannels between channels to the same address by default, so a new
    # client would inherit the reconnect back-off of an old one that saw the server go down.
    ("grpc.use_local_subchannel_pool", 1),
]

_T = TypeVar("_T")


def translate(exc: grpc.RpcError) -> TritonForgeError:
    """The one place a gRPC error becomes a tritonforge error."""
    # Sync errors are grpc.Call objects, grpc.aio's AioRpcError is not: both have these.
    code_fn, details_fn = getattr(exc, "code", None), getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = str((details_fn() if callable(details_fn) else None) or exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        if "restricted" in details:  # Triton's answer to a restricted protocol
            return _wire.server_error(details, status="forbidden")
        return _wire.server_error(details, status="unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Timeout(f"request timed out: {details}")
    if code == grpc.StatusCode.CANCELLED:
        return _wire.server_error(f"request cancelled: {details}", status="cancelled")
    if code == grpc.StatusCode.NOT_FOUND:
        return _wire.server_error(details, status="not_found")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _wire.server_error(details, status="invalid")
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return _wire.server_error(details, status="internal")
    return ServerError(f"{code.name if code else 'gRPC error'}: {details}")


def _service() -> tuple[Any, Any]:
    from tritonclient.grpc import service_pb2, service_pb2_grpc  # type: ignore[import-untyped]

    return service_pb2, service_pb2_grpc


def _admin_metadata(key: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata for Triton's restricted protocols (the repository index)."""
    if not key:
        return ()
    from tritonforge.runtime.server import RESTRICTED_HEADER

    return ((f"triton-grpc-protocol-{RESTRICTED_HEADER}", key),)


def _index(pb: Any, reply: Any) -> list[ModelInfo]:
    return [ModelInfo(m.name, m.version, m.state, m.reason) for m in reply.models]


# ----------------------------------------------------------------------------------------
class GrpcCall:
    """One in-flight ``ModelStreamInfer`` call, iterated as decoded events."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[_wire.Event]:
        return self

    def __next__(self) -> _wire.Event:
        try:
            response = next(self._call)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        final = _wire.grpc_is_final(response)
        if final:
            self._finish()
        return _wire.grpc_event(response, final)

    def _finish(self) -> None:
        """After the final response, read the call to its end (the server's status follows at
        once: the request stream is already closed), so that nothing cancels it later. grpc
        cancels a call whose status was never read when it is collected, or when the caller
        cancels it on an error, and Triton 2.51's gRPC frontend then keeps the request of a
        stream cancelled just after its final response for ever: the model never unloads
        and the server exits 1 at its stop (measured with plain gRPC calls; a race in the
        frontend's stream state, fixed upstream in triton-inference-server/server PR #8078)."""
        with contextlib.suppress(grpc.RpcError):
            for _ in self._call:
                pass

    def cancel(self) -> None:
        self._call.cancel()


class GrpcTransport:
    """Sync gRPC transport on one ``grpc.Channel``."""

    def __init__(self, target: str, *, admin_timeout: float, admin_key: str | None = None) -> None:
        self._pb, grpc_mod = _service()
        self._admin = _admin_metadata(admin_key)
        self._channel = grpc.insecure_channel(target, options=_OPTIONS)
        self._stub = grpc_mod.GRPCInferenceServiceStub(self._channel)
        self._admin_timeout = admin_timeout

    def _unary(self, fn: Callable[..., _T], *args: Any, **kw: Any) -> _T:
        try:
            return fn(*args, timeout=self._admin_timeout, **kw)
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    def open(self, wire: Any, model: str, timeout: float | None) -> GrpcCall:
        try:
            call = self._stub.ModelStreamInfer(iter([wire]), timeout=timeout)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        return GrpcCall(call)

    def index(self) -> list[ModelInfo]:
        reply = self._unary(
            self._stub.RepositoryIndex, self._pb.RepositoryIndexRequest(), metadata=self._admin
        )
        return _index(self._pb, reply)

    def config(self, model: str) -> dict[str, Any]:
        """The model's configuration, in its JSON form (as HTTP answers it)."""
        from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]

        reply = self._unary(self._stub.ModelConfig, self._pb.ModelConfigRequest(name=model))
        return dict(MessageToDict(reply.config, preserving_proto_field_name=True))

    def platform(self, model: str) -> str:
        return str(self.config(model).get("platform", ""))

    def engine_of(self, model: str) -> str | None:
        return _wire.engine_step(self.config(model))

    def stop(self, engine: str, request_id: str, timeout: float) -> None:
        call = self._stub.ModelStreamInfer(iter([_wire.grpc_stop_request(engine, request_id)]),
                                           timeout=timeout)
        for _ in call:
            pass

    def model_ready(self, model: str) -> bool:
        try:
            reply = self._unary(self._stub.ModelReady, self._pb.ModelReadyRequest(name=model))
        except ModelNotReady:
            return False
        return bool(reply.ready)

    def server_ready(self) -> bool:
        reply = self._unary(self._stub.ServerReady, self._pb.ServerReadyRequest())
        return bool(reply.ready)

    def close(self) -> None:
        self._channel.close()


# ----------------------------------------------------------------------------------------
async def _one(item: Any) -> AsyncIterator[Any]:
    yield item


class AsyncGrpcCall:
    """One in-flight ``ModelStreamInfer`` call on a ``grpc.aio`` channel."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __aiter__(self) -> AsyncIterator[_wire.Event]:
        return self

    async def __anext__(self) -> _wire.Event:
        try:
            response = await self._call.read()
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        if response is grpc.aio.EOF:
            raise StopAsyncIteration
        final = _wire.grpc_is_final(response)
        if final:
            await self._finish()
        return _wire.grpc_event(response, final)

    async def _finish(self) -> None:
        """After the final response, read the call to its end (see :meth:`GrpcCall._finish`)."""
        with contextlib.suppress(grpc.RpcError):
            while await self._call.read() is not grpc.aio.EOF:
                pass

    async def cancel(self) -> None:
        self._call.cancel()


class AsyncGrpcTransport:
    """asyncio gRPC transport on one ``grpc.aio.Channel`` (create inside the event loop)."""

    def __init__(self, target: str, *, admin_timeout: float, admin_key: str | None = None) -> None:
        self._pb, grpc_mod = _service()
        self._admin = _admin_metadata(admin_key)
        self._channel = grpc.aio.insecure_channel(target, options=_OPTIONS)
        self._stub = grpc_mod.GRPCInferenceServiceStub(self._channel)
        self._admin_timeout = admin_timeout

    async def _unary(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            return await fn(*args, timeout=self._admin_timeout, **kw)
        except grpc.RpcError as exc:
            raise translate(exc) from exc

    async def open(self, wire: Any, model: str, timeout: float | None) -> AsyncGrpcCall:
        try:
            call = self._stub.ModelStreamInfer(_one(wire), timeout=timeout)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        return AsyncGrpcCall(call)

    async def index(self) -> list[ModelInfo]:
        reply = await self._unary(
            self._stub.RepositoryIndex, self._pb.RepositoryIndexRequest(), metadata=self._admin
        )
        return _index(self._pb, reply)

    async def config(self, model: str) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        reply = await self._unary(self._stub.ModelConfig, self._pb.ModelConfigRequest(name=model))
        return dict(MessageToDict(reply.config, preserving_proto_field_name=True))

    async def platform(self, model: str) -> str:
        return str((await self.config(model)).get("platform", ""))

    async def engine_of(self, model: str) -> str | None:
        return _wire.engine_step(await self.config(model))

    async def stop(self, engine: str, request_id: str, timeout: float) -> None:
        call = self._stub.ModelStreamInfer(_one(_wire.grpc_stop_request(engine, request_id)),
                                           timeout=timeout)
        async for _ in call:
            pass

    async def model_ready(self, model: str) -> bool:
        try:
            reply = await self._unary(self._stub.ModelReady, self._pb.ModelReadyRequest(name=model))
        except ModelNotReady:
            return False
        return bool(reply.ready)

    async def server_ready(self) -> bool:
        reply = await self._unary(self._stub.ServerReady, self._pb.ServerReadyRequest())
        return bool(reply.ready)

    async def close(self) -> None:
        await self._channel.close()
