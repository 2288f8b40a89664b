"""The OpenAI-compatible ASGI app: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/metrics``, ``/health``, over the typed async client.

One :class:`~tritonforge.clients.AsyncClient` (one gRPC channel or HTTP pool) serves every
request. A generation runs in its own task next to a watcher of the client connection:
when the client goes away, the task is cancelled, which leaves the client's ``async with
stream`` block and so cancels the request on Triton. Errors before the first byte are
answered with their HTTP status in OpenAI's shape; a failure after a stream's 200 header
is sent as a last ``data: {"error": ...}`` event followed by ``data: [DONE]``.

Requests are not pre-checked by the client: Triton's preprocessing model runs the
contract's checks (plus those only the server can make, such as the context length) and
its INVALID_ARG message is passed through as a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from tritonforge import contract
from tritonforge.clients import (
    AsyncClient,
    AsyncStream,
    Cancelled,
    Completion,
    EngineError,
    FinishReason,
    Forbidden,
    InvalidRequest,
    ModelNotReady,
    Overloaded,
    ProtocolError,
    Request,
    ServerUnavailable,
    Timeout,
    TritonForgeError,
)
from tritonforge.clients._base import DEFAULT_TIMEOUT, Protocol
from tritonforge.gateway import protocol as oai
from tritonforge.gateway.metrics import CLIENT_CLOSED, CONTENT_TYPE, GatewayMetrics

__all__ = ["API_KEY_ENV", "GatewayConfig", "create_app", "translate"]

API_KEY_ENV: Final = "TRITONFORGE_OPENAI_API_KEY"
CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
_SSE_HEADERS: Final = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_DONE: Final = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway reaches Triton and whom it serves."""

    triton_url: str = "127.0.0.1:8001"
    """Triton's gRPC ``host:port`` (or its HTTP one with ``protocol="http"``)."""
    protocol: Protocol = "grpc"
    """Transport to Triton: ``grpc`` (default) or ``http``."""
    model: str | None = None
    """The Triton ensemble to serve, also its OpenAI model id (default: the one ensemble served)."""
    api_key: str | None = None
    """Bearer key clients must send (``Authorization: Bearer ...``); ``None`` disables the check."""
    timeout: float | None = DEFAULT_TIMEOUT
    """Whole-request deadline in seconds (``None``: none)."""
    admin_key: str | None = None
    """Triton's admin key, only needed to discover the model (default ``$TRITONFORGE_ADMIN_KEY``)."""


def translate(exc: TritonForgeError, guide_field: str | None = None) -> oai.ApiError:
    """The OpenAI-shaped error (and HTTP status) for a client error; ``guide_field`` is the
    request's structured-output field (``response_format``, ``guided_json``, ...), named
    when the server refuses the guide."""
    if isinstance(exc, InvalidRequest):
        param = oai.openai_param(exc.param)
        if guide_field is not None and exc.param in (contract.GUIDE_INPUT, contract.GUIDE_TYPE_INPUT):
            param = guide_field
        return oai.ApiError(400, str(exc), param=param)
    if isinstance(exc, Overloaded):
        return oai.ApiError(503, f"the server is at capacity, retry later: {exc}", "server_error",
                            code="overloaded")
    if isinstance(exc, EngineError):
        return oai.ApiError(500, f"the inference engine failed: {exc}", "server_error", code="engine_failure")
    if isinstance(exc, (ServerUnavailable, ModelNotReady, Forbidden, Cancelled)):
        code = "model_not_ready" if isinstance(exc, ModelNotReady) else "triton_unavailable"
        return oai.ApiError(503, f"Triton is not serving the model: {exc}", "server_error", code=code)
    if isinstance(exc, Timeout):
        return oai.ApiError(504, str(exc), "server_error", code="timeout")
    if isinstance(exc, ProtocolError):
        return oai.ApiError(502, f"Triton's reply broke the serving contract: {exc}", "server_error")
    return oai.ApiError(500, f"Triton failed to answer: {exc}", "server_error")


def _error_response(err: oai.ApiError) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def _send_json(send: Send, status: int, body: Any) -> None:
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# ======================================================================================
def _template_renders_tools(ref: str) -> bool:
    """Whether the chat template of the tokenizer ``ref`` (as preprocessing loads it) renders
    tools (no template: no)."""
    from tritonforge.triton_models.preprocess import chat_template_renders_tools, load_tokenizer

    template = getattr(load_tokenizer(ref), "chat_template", None)
    return isinstance(template, str) and chat_template_renders_tools(template)


class _Gateway:
    """State shared by the routes: config, Triton client (made in the loop), metrics."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.client: AsyncClient | None = None
        self.created = int(time.time())
        self.adapters: list[str] | None = None
        self.auto_tools: oai.ApiError | None = None  # the refusal of tool_choice "auto", once known

    def start(self) -> None:
        c = self.config
        # The server is the one authority on validity (see the module docstring).
        self.client = AsyncClient(c.triton_url, protocol=c.protocol, model=c.model,
                                  timeout=c.timeout, admin_key=c.admin_key, check_requests=False)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def model_name(self) -> str:
        """The served model's name (discovered once from Triton when not configured)."""
        assert self.client is not None
        if self.client.model is None:
            await self.client.ready()  # discovers the one ensemble
        assert self.client.model is not None
        return self.client.model

    async def lora_names(self) -> list[str]:
        """The deployment's LoRA adapters (read once from Triton; none when unreadable)."""
        if self.adapters is None:
            assert self.client is not None
            try:
                self.adapters = await self.client.lora_adapters()
            except TritonForgeError:
                return []  # asked again next time
        return self.adapters

    async def auto_tools_refusal(self) -> oai.ApiError:
        """Why ``tool_choice: "auto"`` is refused for the served model: read once from its
        chat template (the tokenizer preprocessing loads, loaded here too)."""
        if self.auto_tools is not None:
            return self.auto_tools
        assert self.client is not None
        model = await self.model_name()
        try:
            ref = await self.client.tokenizer()
            renders = await asyncio.to_thread(_template_renders_tools, ref)
        except Exception as exc:  # noqa: BLE001 - any failure to read it is said, not hidden
            return oai.auto_tool_choice_refused(None, model, f"its chat template could not be read: {exc}")
        self.auto_tools = oai.auto_tool_choice_refused(renders, model)
        return self.auto_tools

    async def adapter_for(self, model: str) -> tuple[str, str | None]:
        """(the served ensemble, the LoRA adapter) a request's ``model`` names: the ensemble
        itself, ``<ensemble>:<adapter>`` or an adapter's own id (as ``/v1/models`` lists
        them, like vLLM's server); a 404 naming what is served otherwise."""
        served = await self.model_name()
        if model == served:
            return served, None
        names = await self.lora_names()
        base, sep, adapter = model.partition(":")
        if model in names or (sep and base == served and adapter in names):
            return served, adapter if sep else model
        offered = ", ".join([served, *names, *(f"{served}:{n}" for n in names)])
        raise oai.ApiError(404, f"The model '{model}' does not exist; this server serves {offered}",
                           param="model", code="model_not_found")

    def authorize(self, request: HttpRequest) -> None:
        key = self.config.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise oai.ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key")


class _Generation:
    """The answer to one generation request, as an ASGI response (see the module docstring)."""

    def __init__(self, gw: _Gateway, endpoint: str, received: float, request: Request, model: str,
                 stream: bool, include_usage: bool, guide_field: str | None = None,
                 calling: oai.ToolCalling | None = None) -> None:
        self.gw = gw
        self.endpoint = endpoint
        self.received = received
        self.request = request
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.guide_field = guide_field
        self.calling = calling
        self.rid = request.request_id or oai.new_id("cmpl")
        self.created = int(time.time())
        self.chat = endpoint == CHAT

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._answer(send))
        watch = asyncio.ensure_future(_until_disconnect(receive))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            watch.cancel()
            raise
        if work in done:
            watch.cancel()
            work.result()
            return
        work.cancel()  # the client went away: leaving the stream cancels the Triton request
        with contextlib.suppress(asyncio.CancelledError):
            await work

    async def _answer(self, send: Send) -> None:
        m = self.gw.metrics
        assert self.gw.client is not None
        status = CLIENT_CLOSED
        m.in_flight.labels(self.endpoint).inc()
        try:
            try:
                async with self.gw.client.stream(self.request) as s:
                    if self.stream:
                        status = await self._sse(s, send)
                    else:
                        status = await self._json(s, send)
            except TritonForgeError as exc:  # nothing sent yet
                err = translate(exc, self.guide_field)
                status = err.status
                await _send_json(send, err.status, err.body())
        finally:
            m.in_flight.labels(self.endpoint).dec()
            m.finished(self.endpoint, status, time.perf_counter() - self.received)

    async def _json(self, s: AsyncStream, send: Send) -> int:
        async for _ in s:
            pass
        c = s.completion
        self._count(c)
        asked = bool(self.request.logprobs)
        if self.chat:
            choices = [oai.chat_choice(ch.index, ch.text, ch.finish_reason, self._tool_calls(c),
                                       oai.chat_logprobs(ch.logprobs) if asked else None) for ch in c.choices]
            body = oai.chat_response(self.rid, self.created, self.model, choices, c.prompt_tokens,
                                     c.completion_tokens)
        else:
            choices = [oai.completion_choice(ch.index, ch.text, ch.finish_reason,
                                             oai.completion_logprobs(ch.logprobs) if asked else None)
                       for ch in c.choices]
            body = oai.completion_response(self.rid, self.created, self.model, choices, c.prompt_tokens,
                                           c.completion_tokens)
        await _send_json(send, 200, body)
        return 200

    def _tool_calls(self, c: Completion) -> list[dict[str, Any]] | None:
        """The tool calls of a finished tool-calling generation (``None``: answer its text,
        e.g. when ``max_tokens`` cut the JSON short)."""
        if self.calling is None or c.finish_reason is not FinishReason.STOP:
            return None
        return self.calling.calls(c.text)

    async def _sse(self, s: AsyncStream, send: Send) -> int:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        status = 200
        try:
            async for piece in self._events(s):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except TritonForgeError as exc:
            err = translate(exc, self.guide_field)
            status = err.status
            await send({"type": "http.response.body", "body": _event(err.body()) + _DONE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return status

    async def _tool_events(self, s: AsyncStream) -> AsyncIterator[bytes]:
        """A tool-calling chat stream: a named function's arguments streamed as deltas of
        its one call; ``"required"`` calls sent once the list of them is complete."""
        assert self.calling is not None
        rid, created, model, usage_null = self.rid, self.created, self.model, self.include_usage
        named = self.calling.named
        call = {"id": oai.new_id("call"), "function": {"name": named}}
        text: list[str] = []
        first = True
        async for chunk in s:
            if not chunk.text:
                continue
            text.append(chunk.text)
            if first:
                first = False
                self.gw.metrics.ttft.labels(self.endpoint).observe(time.perf_counter() - self.received)
                yield _event(oai.chat_chunk(rid, created, model, {"role": "assistant", "content": None},
                                            include_usage=usage_null))
            if named is not None:
                delta = oai.tool_call_delta(0, call if len(text) == 1 else None, chunk.text)
                yield _event(oai.chat_chunk(rid, created, model, delta, include_usage=usage_null))
        c = s.completion
        self._count(c)
        calls = self._tool_calls(c)
        if named is None:
            if calls is None:  # cut short: the text as it is
                yield _event(oai.chat_chunk(rid, created, model, {"content": "".join(text)},
                                            include_usage=usage_null))
            for i, one in enumerate(calls or ()):
                yield _event(oai.chat_chunk(rid, created, model,
                                            oai.tool_call_delta(i, one, one["function"]["arguments"]),
                                            include_usage=usage_null))
        finish = "tool_calls" if calls is not None else c.finish_reason
        yield _event(oai.chat_chunk(rid, created, model, {}, finish, include_usage=usage_null))
        if self.include_usage:
            yield _event(oai.usage_chunk("chat.completion.chunk", rid, created, model,
                                         oai.usage(c.prompt_tokens, c.completion_tokens)))
        yield _DONE

    async def _events(self, s: AsyncStream) -> AsyncIterator[bytes]:
        if self.calling is not None:
            async for piece in self._tool_events(s):
                yield piece
            return
        rid, created, model, usage_null = self.rid, self.created, self.model, self.include_usage
        asked = bool(self.request.logprobs)
        offsets: dict[int, int] = {}  # per choice: characters streamed so far (text_offset)
        async for chunk in s:
            finish = chunk.finish_reason if chunk.finish_reason is not FinishReason.NONE else None
            if not chunk.text and finish is None and not chunk.logprobs:
                continue  # tokens that do not make a whole character yet
            i = chunk.sequence
            if not offsets:
                self.gw.metrics.ttft.labels(self.endpoint).observe(time.perf_counter() - self.received)
            if i not in offsets and self.chat:  # each choice's first chunk says who speaks
                yield _event(oai.chat_chunk(rid, created, model, {"role": "assistant", "content": ""},
                                            include_usage=usage_null, index=i))
            offset = offsets.setdefault(i, 0)
            if self.chat:
                delta = {"content": chunk.text} if chunk.text else {}
                yield _event(oai.chat_chunk(rid, created, model, delta, finish, include_usage=usage_null,
                                            logprobs=oai.chat_logprobs(chunk.logprobs) if asked else None,
                                            index=i))
            else:
                yield _event(oai.completion_chunk(
                    rid, created, model, chunk.text, finish, include_usage=usage_null,
                    logprobs=oai.completion_logprobs(chunk.logprobs, offset) if asked else None, index=i))
            offsets[i] = offset + len(chunk.text)
        c = s.completion
        self._count(c)
        if self.include_usage:
            obj = "chat.completion.chunk" if self.chat else "text_completion"
            yield _event(oai.usage_chunk(obj, rid, created, model,
                                         oai.usage(c.prompt_tokens, c.completion_tokens)))
        yield _DONE

    def _count(self, c: Completion) -> None:
        self.gw.metrics.tokens(self.endpoint, c.prompt_tokens, c.completion_tokens)


# ======================================================================================
def create_app(config: GatewayConfig | None = None) -> Starlette:
    """The gateway as an ASGI app (serve it with uvicorn; the Triton client is made at startup)."""
    gw = _Gateway(config or GatewayConfig())

    def guarded(endpoint: str, handler: Callable[[HttpRequest, float], Awaitable[Response | _Generation]]
                ) -> Callable[[HttpRequest], Awaitable[Any]]:
        async def route(request: HttpRequest) -> Any:
            received = time.perf_counter()
            try:
                gw.authorize(request)
                return await handler(request, received)
            except oai.ApiError as err:
                gw.metrics.finished(endpoint, err.status, time.perf_counter() - received)
                return _error_response(err)
            except TritonForgeError as exc:
                refused = translate(exc)
                gw.metrics.finished(endpoint, refused.status, time.perf_counter() - received)
                return _error_response(refused)
        return route

    async def _body(request: HttpRequest) -> Any:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise oai.ApiError(400, f"the request body is not valid JSON: {exc}") from None

    async def generation(endpoint: str, request: HttpRequest, received: float) -> _Generation:
        kind = oai.ChatCompletionRequest if endpoint == CHAT else oai.CompletionRequest
        body = oai.parse(kind, await _body(request))
        _, adapter = await gw.adapter_for(body.model)
        if isinstance(body, oai.ChatCompletionRequest) and body.wants_auto_tools():
            raise await gw.auto_tools_refusal()
        prefix = "chatcmpl" if endpoint == CHAT else "cmpl"
        req = body.to_request().replace(request_id=oai.new_id(prefix), stream=bool(body.stream), lora=adapter)
        guide = body.guide()
        calling = body.tool_calling() if isinstance(body, oai.ChatCompletionRequest) else None
        return _Generation(gw, endpoint, received, req, body.model, bool(body.stream), body.include_usage,
                           "tool_choice" if calling else guide[0] if guide else None, calling)

    async def chat(request: HttpRequest, received: float) -> _Generation:
        return await generation(CHAT, request, received)

    async def completions(request: HttpRequest, received: float) -> _Generation:
        return await generation(COMPLETIONS, request, received)

    async def models(request: HttpRequest, received: float) -> Response:
        name = await gw.model_name()
        cards = [oai.model_card(name, gw.created)] + [oai.model_card(a, gw.created, parent=name)
                                                      for a in await gw.lora_names()]
        gw.metrics.finished("/v1/models", 200, time.perf_counter() - received)
        return JSONResponse({"object": "list", "data": cards})

    async def metrics(request: HttpRequest) -> Response:
        return Response(gw.metrics.exposition(), media_type=CONTENT_TYPE)

    async def health(request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = Starlette(
        routes=[
            Route(CHAT, guarded(CHAT, chat), methods=["POST"]),
            Route(COMPLETIONS, guarded(COMPLETIONS, completions), methods=["POST"]),
            Route("/v1/models", guarded("/v1/models", models), methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app
