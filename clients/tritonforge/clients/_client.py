"""``Client`` and ``AsyncClient`` (and their streams): thin twins over :class:`BaseClient`.

The sync and asyncio versions sit side by side so they read line for line the same; only
``await`` and the ``a`` prefix of ``aclose`` differ.

A stream sends its request when entered (``with client.stream(...) as s``) or first
iterated, waits for the first response (retrying a refused connection up to
``connect_retries`` times), and yields :class:`Chunk` objects. Leaving the ``with`` block,
``close()``/``aclose()``, an exception or asyncio task cancellation cancels the request on
the server. A stream can be iterated once; ``completion`` is available at its end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final

from tritonforge.clients import _wire
from tritonforge.clients._base import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    BaseClient,
    ModelInfo,
    Protocol,
    Recorder,
    RequestInput,
    discovery_forbidden,
    pick_ensemble,
)
from tritonforge.clients._grpc import AsyncGrpcCall, AsyncGrpcTransport, GrpcCall, GrpcTransport
from tritonforge.clients._http import AsyncHttpCall, AsyncHttpTransport, HttpCall, HttpTransport
from tritonforge.clients._models import Chunk, Completion, Message, Request, RequestOverrides
from tritonforge.clients.exceptions import (
    Cancelled,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    ProtocolError,
    ServerUnavailable,
    StreamConsumed,
    StreamError,
    Timeout,
    TritonForgeError,
)
from tritonforge.contract import MODEL_PREPROCESSING, Param
from typing_extensions import Self, Unpack

__all__ = ["AsyncClient", "AsyncStream", "Client", "Stream"]

Messages = Sequence[Message | dict[str, str]]


def _tokenizer_ref(preprocessing_config: dict[str, Any]) -> str:
    """The tokenizer reference in a preprocessing model's config (JSON form): its
    ``tritonforge_tokenizer`` parameter, else its model's."""
    params = preprocessing_config.get("parameters") or {}
    for key in (Param.TOKENIZER, Param.MODEL):
        ref = (params.get(key.value) or {}).get("string_value")
        if ref:
            return str(ref)
    raise ProtocolError(f"the {MODEL_PREPROCESSING} model's config names no tokenizer")


class _State(enum.Enum):
    NEW = "new"  # request not sent yet
    OPEN = "open"  # request in flight
    DONE = "done"  # final response received
    CLOSED = "closed"  # closed before the end (request cancelled)


STOP_TIMEOUT: Final = 5.0  # seconds for the best-effort server-side stop of a left stream


def with_request_id(request: Request) -> Request:
    """Every request carries an id: postprocessing keys its detokenizer state by it, and a
    stream left early is stopped on the engine by it."""
    if request.request_id:
        return request
    return dataclasses.replace(request, request_id=uuid.uuid4().hex)


_END: Final = object()  # "the call ended" marker for the first-response slot


def _cancelled(exc: TritonForgeError | None = None) -> Cancelled:
    """What reading a stream that was closed mid-stream raises: also when the close (from
    another thread or task) lands between two reads, or while responses were already
    buffered -- not a silent end, which would pass for a finished stream."""
    err = Cancelled("the stream was closed while a response was being read")
    err.__cause__ = exc
    return err


# ========================================================================================
class Stream:
    """The responses of one request, as :class:`Chunk` objects (sync)."""

    def __init__(self, client: Client, request: Request) -> None:
        self._client = client
        self.request = with_request_id(request)
        self._state = _State.NEW
        self._iterated = False
        self._cancelled = False
        self._call: GrpcCall | HttpCall | None = None
        self._first: Any = None
        self._rec: Recorder | None = None

    def _open(self) -> None:
        if self._state is not _State.NEW:
            return
        client = self._client
        model = client.resolve_model()
        rec = Recorder(model, self.request, client.timeout_for(self.request))
        wire = client.wire_request(self.request, model)
        attempt = 0
        while True:
            rec.restart()
            call = None
            try:
                call = client._get_transport().open(wire, model, rec.remaining())
                first: Any = next(call, _END)
                break
            except ServerUnavailable:
                if call is not None:
                    call.cancel()
                if not client.can_retry(attempt):
                    raise
                time.sleep(client.backoff(attempt))
                attempt += 1
            except BaseException as exc:
                # Interrupted (timeout, Ctrl-C, close) before the first response: the request
                # may be queued on the server, where only the engine's stop removes it. Over
                # HTTP a timeout can strike before there is a call object at all.
                if call is not None:
                    call.cancel()
                if call is not None or isinstance(exc, (Timeout, KeyboardInterrupt)):
                    client._stop_on_server(model, self.request.request_id)
                if isinstance(exc, InvalidRequest) and exc.kind is None:
                    raise client._refused_by_triton(exc, model) from exc
                raise
        self._call, self._first, self._rec, self._state = call, first, rec, _State.OPEN

    def _take(self) -> _wire.Event | None:
        if self._first is not None:
            first, self._first = self._first, None
            return None if first is _END else first
        assert self._call is not None
        try:
            return next(self._call)
        except StopIteration:
            return None
        except TritonForgeError as exc:
            if self._cancelled:
                raise _cancelled(exc) from exc
            raise

    def __enter__(self) -> Self:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __iter__(self) -> Self:
        if self._iterated or self._state in (_State.DONE, _State.CLOSED):
            raise StreamConsumed("this stream was already consumed or closed; send a new request")
        self._iterated = True
        return self

    def __next__(self) -> Chunk:
        if self._state is _State.CLOSED and self._cancelled:
            raise _cancelled()
        if self._state in (_State.DONE, _State.CLOSED):
            raise StopIteration
        try:
            self._open()
            assert self._rec is not None
            while True:
                event = self._take()
                if event is None:
                    self._state = _State.DONE
                    raise StopIteration
                chunk = self._rec.add(event)
                if event.final:
                    self._state = _State.DONE
                else:
                    self._rec.check_deadline()
                if chunk is not None:
                    return chunk
                if event.final:
                    raise StopIteration
        except StopIteration:
            raise
        except BaseException:
            self.close()
            self._cancelled = False  # ended by this error, not by a close: a later read stops
            raise

    @property
    def completion(self) -> Completion:
        """The whole generation with its timings; available once the stream has ended."""
        if self._state is not _State.DONE or self._rec is None:
            raise StreamError("the stream has not finished: iterate it to the end first")
        return self._rec.finish()

    def close(self) -> None:
        """Close the stream; cancels the request on the server if it is still running."""
        if self._state is _State.OPEN and self._call is not None:
            self._cancelled = True
            self._call.cancel()
            if self._rec is not None:
                self._client._stop_on_server(self._rec.model, self.request.request_id)
        if self._state is not _State.DONE:
            self._state = _State.CLOSED

    def __del__(self) -> None:
        if getattr(self, "_state", None) is _State.OPEN and self._call is not None:
            self._call.cancel()


class AsyncStream:
    """The responses of one request, as :class:`Chunk` objects (asyncio)."""

    def __init__(self, client: AsyncClient, request: Request) -> None:
        self._client = client
        self.request = with_request_id(request)
        self._state = _State.NEW
        self._iterated = False
        self._cancelled = False
        self._call: AsyncGrpcCall | AsyncHttpCall | None = None
        self._first: Any = None
        self._rec: Recorder | None = None

    async def _open(self) -> None:
        if self._state is not _State.NEW:
            return
        client = self._client
        model = await client.resolve_model()
        rec = Recorder(model, self.request, client.timeout_for(self.request))
        wire = client.wire_request(self.request, model)
        attempt = 0
        while True:
            rec.restart()
            call = None
            try:
                call = await (await client._get_transport()).open(wire, model, rec.remaining())
                first: Any = await anext(call, _END)
                break
            except ServerUnavailable:
                if call is not None:
                    await call.cancel()
                if not client.can_retry(attempt):
                    raise
                await asyncio.sleep(client.backoff(attempt))
                attempt += 1
            except BaseException as exc:
                # Interrupted (timeout, task cancellation) before the first response: the
                # request may be queued on the server, where only the engine's stop removes it.
                # Over HTTP a timeout can strike before there is a call object at all.
                if call is not None:
                    await call.cancel()
                if call is not None or isinstance(exc, (Timeout, asyncio.CancelledError)):
                    await client._stop_on_server(model, self.request.request_id)
                if isinstance(exc, InvalidRequest) and exc.kind is None:
                    raise await client._refused_by_triton(exc, model) from exc
                raise
        self._call, self._first, self._rec, self._state = call, first, rec, _State.OPEN

    async def _take(self) -> _wire.Event | None:
        if self._first is not None:
            first, self._first = self._first, None
            return None if first is _END else first
        assert self._call is not None
        try:
            return await self._call.__anext__()
        except StopAsyncIteration:
            return None
        except TritonForgeError as exc:
            if self._cancelled:
                raise _cancelled(exc) from exc
            raise

    async def __aenter__(self) -> Self:
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        if self._iterated or self._state in (_State.DONE, _State.CLOSED):
            raise StreamConsumed("this stream was already consumed or closed; send a new request")
        self._iterated = True
        return self

    async def __anext__(self) -> Chunk:
        if self._state is _State.CLOSED and self._cancelled:
            raise _cancelled()
        if self._state in (_State.DONE, _State.CLOSED):
            raise StopAsyncIteration
        try:
            await self._open()
            assert self._rec is not None
            while True:
                event = await self._take()
                if event is None:
                    self._state = _State.DONE
                    raise StopAsyncIteration
                chunk = self._rec.add(event)
                if event.final:
                    self._state = _State.DONE
                else:
                    self._rec.check_deadline()
                if chunk is not None:
                    return chunk
                if event.final:
                    raise StopAsyncIteration
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()
            self._cancelled = False  # ended by this error, not by a close: a later read stops
            raise

    @property
    def completion(self) -> Completion:
        """The whole generation with its timings; available once the stream has ended."""
        if self._state is not _State.DONE or self._rec is None:
            raise StreamError("the stream has not finished: iterate it to the end first")
        return self._rec.finish()

    async def aclose(self) -> None:
        """Close the stream; cancels the request on the server if it is still running."""
        if self._state is _State.OPEN and self._call is not None:
            self._cancelled = True
            self._state = _State.CLOSED
            await self._call.cancel()
            if self._rec is not None:
                await self._client._stop_on_server(self._rec.model, self.request.request_id)
        if self._state is not _State.DONE:
            self._state = _State.CLOSED

    def __del__(self) -> None:
        if getattr(self, "_state", None) is _State.OPEN and isinstance(self._call, AsyncGrpcCall):
            self._call._call.cancel()


# ========================================================================================
class Client(BaseClient):
    """Sync client of a tritonforge deployment over gRPC (default) or HTTP.

    ``url`` is ``host:port`` (default ``127.0.0.1:8001`` for gRPC, ``:8000`` for HTTP);
    ``model`` the ensemble to call (default: discovered, the one ensemble served);
    ``timeout`` each request's deadline in seconds (``None``: none); ``connect_retries``
    how often a refused connection is retried before the first response; ``admin_key``
    the server's admin key, sent only to list its models for discovery (default:
    ``$TRITONFORGE_ADMIN_KEY``); ``check_requests`` whether each request is checked
    against the contract's bounds before it is sent (the gateway turns it off: the server
    is the one authority and answers with its own messages). One client
    serves any number of concurrent streams (threads or gevent greenlets).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: Protocol = "grpc",
        model: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        connect_retries: int = 3,
        admin_key: str | None = None,
        check_requests: bool = True,
    ) -> None:
        super().__init__(url, protocol=protocol, model=model, timeout=timeout,
                         connect_timeout=connect_timeout, connect_retries=connect_retries,
                         admin_key=admin_key, check_requests=check_requests)
        self._transport: GrpcTransport | HttpTransport | None = None
        self._engines: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _get_transport(self) -> GrpcTransport | HttpTransport:
        if self._transport is None:
            with self._lock:
                if self._closed:
                    raise ServerUnavailable("the client is closed")
                if self._transport is None:
                    cls = GrpcTransport if self.protocol == "grpc" else HttpTransport
                    self._transport = cls(
                        self.url, admin_timeout=self.connect_timeout, admin_key=self._admin_key
                    )
        return self._transport

    def resolve_model(self) -> str:
        """The model this client sends to: the one it was given, else the one ensemble the
        server has ready (discovery lists the repository: needs the admin key if set)."""
        if self._model is None:
            t = self._get_transport()
            try:
                ready = [m.name for m in t.index() if m.ready]
            except Forbidden as exc:
                raise discovery_forbidden(exc) from exc
            self._model = pick_ensemble({name: t.platform(name) for name in ready})
        return self._model

    def stream(self, request: RequestInput = None, /, **overrides: Unpack[RequestOverrides]) -> Stream:
        """A stream of the request's chunks: ``with client.stream("Hi") as s: for c in s: ...``."""
        return Stream(self, self.build_request(request, overrides))

    def complete(self, request: RequestInput = None, /, **overrides: Unpack[RequestOverrides]) -> Completion:
        """Send one request and wait for the whole :class:`Completion`."""
        with self.stream(request, **overrides) as s:
            for _ in s:
                pass
            return s.completion

    def chat(self, messages: Messages, /, **overrides: Unpack[RequestOverrides]) -> Completion:
        """Send chat ``messages`` (``[{"role": ..., "content": ...}]``) and wait for the reply."""
        return self.complete(Request(messages=messages), **overrides)

    def _refused_by_triton(self, exc: InvalidRequest, model: str) -> TritonForgeError:
        """An untagged refusal comes from Triton itself: for a model that is not ready
        (unknown, unloaded) that is :class:`ModelNotReady`, asked of the server."""
        try:
            ready = self._get_transport().model_ready(model)
        except ServerUnavailable as gone:  # the server is going away (a restart, a stop)
            return gone
        except TritonForgeError:
            return exc
        return exc if ready else ModelNotReady(str(exc))

    def _stop_on_server(self, model: str, request_id: str | None) -> None:
        """Ask the ensemble's engine step to drop ``request_id`` (best effort, never raises):
        Triton 2.51 ensembles do not forward a client's cancellation to a running step."""
        if not request_id:
            return
        try:
            transport = self._get_transport()
            if model not in self._engines:
                self._engines[model] = transport.engine_of(model)
            engine = self._engines[model]
            if engine:
                transport.stop(engine, request_id, STOP_TIMEOUT)
        except Exception:  # noqa: BLE001 - cancellation is best effort; the stream is gone
            pass

    def lora_adapters(self) -> list[str]:
        """The names of the LoRA adapters the deployment serves (``Request(lora=...)``)."""
        return _wire.lora_names(self._get_transport().config(MODEL_PREPROCESSING))

    def tokenizer(self) -> str:
        """The tokenizer (and chat template) the deployment's preprocessing loads: a model
        reference, a folder or ``package:<name>``."""
        return _tokenizer_ref(self._get_transport().config(MODEL_PREPROCESSING))

    def models(self) -> list[ModelInfo]:
        """The server's model repository index."""
        return self._get_transport().index()

    def ready(self, model: str | None = None) -> bool:
        """Whether ``model`` (default: this client's model) is loaded and ready."""
        return self._get_transport().model_ready(model or self.resolve_model())

    def close(self) -> None:
        """Close the connection; streams still running are cancelled."""
        with self._lock:
            self._closed = True
            transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(BaseClient):
    """asyncio client of a tritonforge deployment over gRPC (default) or HTTP.

    Same arguments as :class:`Client`. Create it anywhere; its connection is made inside
    the running event loop on first use. One client serves any number of concurrent tasks.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        protocol: Protocol = "grpc",
        model: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        connect_retries: int = 3,
        admin_key: str | None = None,
        check_requests: bool = True,
    ) -> None:
        super().__init__(url, protocol=protocol, model=model, timeout=timeout,
                         connect_timeout=connect_timeout, connect_retries=connect_retries,
                         admin_key=admin_key, check_requests=check_requests)
        self._transport: AsyncGrpcTransport | AsyncHttpTransport | None = None
        self._engines: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._closed = False

    async def _get_transport(self) -> AsyncGrpcTransport | AsyncHttpTransport:
        if self._transport is None:
            with self._lock:
                if self._closed:
                    raise ServerUnavailable("the client is closed")
                if self._transport is None:
                    cls = AsyncGrpcTransport if self.protocol == "grpc" else AsyncHttpTransport
                    self._transport = cls(
                        self.url, admin_timeout=self.connect_timeout, admin_key=self._admin_key
                    )
        return self._transport

    async def resolve_model(self) -> str:
        """The model this client sends to: the one it was given, else the one ensemble the
        server has ready (discovery lists the repository: needs the admin key if set)."""
        if self._model is None:
            t = await self._get_transport()
            try:
                ready = [m.name for m in await t.index() if m.ready]
            except Forbidden as exc:
                raise discovery_forbidden(exc) from exc
            self._model = pick_ensemble({name: await t.platform(name) for name in ready})
        return self._model

    def stream(self, request: RequestInput = None, /, **overrides: Unpack[RequestOverrides]) -> AsyncStream:
        """A stream of the request's chunks: ``async with client.stream("Hi") as s: async for c in s``."""
        return AsyncStream(self, self.build_request(request, overrides))

    async def complete(self, request: RequestInput = None, /, **overrides: Unpack[RequestOverrides]) -> Completion:
        """Send one request and wait for the whole :class:`Completion`."""
        async with self.stream(request, **overrides) as s:
            async for _ in s:
                pass
            return s.completion

    async def chat(self, messages: Messages, /, **overrides: Unpack[RequestOverrides]) -> Completion:
        """Send chat ``messages`` (``[{"role": ..., "content": ...}]``) and wait for the reply."""
        return await self.complete(Request(messages=messages), **overrides)

    async def _refused_by_triton(self, exc: InvalidRequest, model: str) -> TritonForgeError:
        """Async twin of :meth:`Client._refused_by_triton`."""
        try:
            ready = await (await self._get_transport()).model_ready(model)
        except ServerUnavailable as gone:
            return gone
        except TritonForgeError:
            return exc
        return exc if ready else ModelNotReady(str(exc))

    async def _stop_on_server(self, model: str, request_id: str | None) -> None:
        """Async twin of :meth:`Client._stop_on_server` (best effort, never raises)."""
        if not request_id:
            return
        try:
            transport = await self._get_transport()
            if model not in self._engines:
                self._engines[model] = await transport.engine_of(model)
            engine = self._engines[model]
            if engine:
                await asyncio.wait_for(transport.stop(engine, request_id, STOP_TIMEOUT), STOP_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - cancellation is best effort; the stream is gone
            pass

    async def lora_adapters(self) -> list[str]:
        """The names of the LoRA adapters the deployment serves (``Request(lora=...)``)."""
        return _wire.lora_names(await (await self._get_transport()).config(MODEL_PREPROCESSING))

    async def tokenizer(self) -> str:
        """The tokenizer (and chat template) the deployment's preprocessing loads: a model
        reference, a folder or ``package:<name>``."""
        return _tokenizer_ref(await (await self._get_transport()).config(MODEL_PREPROCESSING))

    async def models(self) -> list[ModelInfo]:
        """The server's model repository index."""
        return await (await self._get_transport()).index()

    async def ready(self, model: str | None = None) -> bool:
        """Whether ``model`` (default: this client's model) is loaded and ready."""
        return await (await self._get_transport()).model_ready(model or await self.resolve_model())

    async def aclose(self) -> None:
        """Close the connection; streams still running are cancelled."""
        with self._lock:
            self._closed = True
            transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
