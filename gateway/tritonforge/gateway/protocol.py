"""The OpenAI wire models the gateway speaks (requests parsed, responses built; no I/O).

Requests are pydantic models that refuse what the gateway cannot honour (``logit_bias``,
``echo``, ``suffix``, audio...) and fields OpenAI's API does not know, with an
:class:`ApiError` naming the parameter; OpenAI's metadata fields (``user``, ``store``...)
are accepted. :meth:`ChatCompletionRequest.to_request`
and :meth:`CompletionRequest.to_request` turn them into the typed client's
:class:`~tritonforge.clients.Request`; every sampling bound is then checked by the
contract (the same check the server runs), not restated here.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from tritonforge import contract
from tritonforge.clients import FinishReason, Request, TokenLogprob

__all__ = [
    "METADATA_FIELDS",
    "UNSUPPORTED_FIELDS",
    "ApiError",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ErrorType",
    "ResponseFormat",
    "StreamOptions",
    "ToolCalling",
    "ToolDef",
    "auto_tool_choice_refused",
    "chat_choice",
    "chat_chunk",
    "chat_response",
    "completion_choice",
    "completion_chunk",
    "completion_response",
    "error_body",
    "model_card",
    "new_id",
    "openai_param",
    "parse",
    "tool_call_delta",
    "usage",
    "usage_chunk",
]

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "not_found_error",
    "server_error",
    "service_unavailable",
    "timeout",
]
OWNER: Final = "tritonforge"


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: ErrorType = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error reply (also sent as a stream's last event)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def openai_param(ensemble_name: str | None) -> str | None:
    """The OpenAI field of a request parameter the server named (by its ensemble name)."""
    if ensemble_name is None:
        return None
    try:
        return contract.param(ensemble_name).openai or ensemble_name
    except KeyError:
        return ensemble_name


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ======================================================================================
class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk carrying the usage."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


# The request parameters the gateway maps from OpenAI fields to the typed client's fields,
# from the contract's table (prompt/messages and stream are handled by the endpoints).
_MAPPED: Final = tuple(
    p for p in contract.REQUEST_PARAMETERS
    if p.openai is not None and p.client is not None and p.kind != "prompt" and p.name != "stream"
)


def _field_type(p: contract.RequestParam) -> Any:
    if p.kind == "words":
        return str | list[str] | None
    if p.dtype is contract.DType.BOOL:
        return bool | None
    return (int if p.dtype.is_integer else float) | None


_SamplingFields: Any = create_model(
    "_SamplingFields",
    __config__=ConfigDict(extra="ignore"),
    **{p.openai: (_field_type(p), None) for p in _MAPPED},  # type: ignore[misc]
)


# vLLM's structured-output extras (guided_json, guided_regex, ...), one per guide type of
# the contract that has one.
_GUIDED: Final = {g.openai: g for g in contract.GUIDES if g.openai is not None}
_GUIDE_TYPES: Final[dict[contract.GuideType, Any]] = {
    contract.GuideType.JSON_SCHEMA: dict[str, Any] | str | None,
    contract.GuideType.CHOICE: list[str] | None,
}
_GUIDED_FIELDS: Final[dict[str, Any]] = {
    name: (_GUIDE_TYPES.get(g.type, str | None), None) for name, g in _GUIDED.items()}
_GuidedFields: Any = create_model("_GuidedFields", __base__=_SamplingFields, **_GUIDED_FIELDS)
_BY_TYPE: Final = {g.type: g for g in contract.GUIDES}


class ResponseFormat(BaseModel):
    """``response_format``: ``text``, ``json_object`` or ``json_schema`` (``{name, schema,
    strict, description}``; the schema is always enforced, ``strict`` or not)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


# OpenAI request fields that ask nothing of the generation (accepted; nothing to do).
METADATA_FIELDS: Final = frozenset({"user", "store", "metadata", "service_tier", "safety_identifier",
                                    "prompt_cache_key"})
# OpenAI request fields this gateway cannot honour: refused with a 400 naming them (the value
# that asks for nothing, where there is one, passes).
UNSUPPORTED_FIELDS: Final[dict[str, tuple[Any, ...]]] = {
    "logit_bias": (None, {}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "functions": (None,),  # the deprecated form of tools
    "function_call": (None,),  # the deprecated form of tool_choice
    "reasoning_effort": (None,),
    "verbosity": (None,),
}


class _Sampling(_GuidedFields):  # type: ignore[misc]
    """Fields shared by both endpoints: OpenAI's names (and vLLM's extensions), one per
    row of the contract's table with an OpenAI name, plus the OpenAI-only controls. Any
    other field is refused (as OpenAI's API does), except OpenAI's metadata fields."""

    model_config = ConfigDict(extra="allow")

    response_format: ResponseFormat | None = None

    model: str
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension (its benchmark client sends it)

    def _refuse_unsupported(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in METADATA_FIELDS:
                continue
            if name in UNSUPPORTED_FIELDS:
                if value not in UNSUPPORTED_FIELDS[name]:
                    raise ApiError(400, f"{name} is not supported by this server", param=name)
                continue
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", param=name)
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")

    def guide(self) -> tuple[str, str, Any] | None:
        """The structured output asked for: (the OpenAI field that asked, the typed client's
        field, its value), or ``None``; more than one is refused."""
        asked: list[tuple[str, str, Any]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked.append(("response_format", _BY_TYPE[contract.GuideType.JSON].client, True))
        elif rf is not None and rf.type == "json_schema":
            spec = rf.json_schema or {}
            schema = spec.get("schema")
            if not isinstance(schema, dict):
                raise ApiError(400, "response_format.json_schema.schema must be a JSON schema (an object)",
                               param="response_format")
            if not isinstance(spec.get("strict", False), (bool, type(None))):
                raise ApiError(400, "response_format.json_schema.strict must be true or false",
                               param="response_format")
            asked.append(("response_format", _BY_TYPE[contract.GuideType.JSON_SCHEMA].client, schema))
        for name, g in _GUIDED.items():
            if (value := getattr(self, name)) is not None:
                asked.append((name, g.client, value))
        if len(asked) > 1:
            raise ApiError(400, "give one structured output at most; got " + ", ".join(a[0] for a in asked),
                           param=asked[1][0])
        return asked[0] if asked else None

    def _sampling(self, max_tokens: int | None) -> dict[str, Any]:
        """The typed client's request fields (the contract's mapping)."""
        out: dict[str, Any] = {}
        if (guide := self.guide()) is not None:
            out[guide[1]] = guide[2]
        for p in _MAPPED:
            value = getattr(self, p.openai or "")
            if p.kind == "words":
                value = ([value] if isinstance(value, str) else value) or None
            out[p.client or ""] = value
        out["max_tokens"] = max_tokens
        out["n"] = self.n if self.n != 1 else None
        if self.ignore_eos:
            if max_tokens is None:
                raise ApiError(400, "ignore_eos needs max_tokens (generate exactly that many tokens)",
                               param="ignore_eos")
            out["min_tokens"] = max_tokens
        return out

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class FunctionDef(BaseModel):
    """``tools[i].function``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """One of ``tools``: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class _NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: _NamedFunction


_ANY_OBJECT: Final[dict[str, Any]] = {"type": "object"}


@dataclass(frozen=True)
class ToolCalling:
    """A request that must answer with tool calls, enforced by structured outputs: a named
    ``tool_choice`` generates that function's arguments (JSON valid for its parameters
    schema), ``"required"`` a JSON list of one or more ``{"name", "arguments"}`` calls of
    the request's tools. :meth:`calls` turns the generated text into OpenAI ``tool_calls``."""

    tools: tuple[ToolDef, ...]
    named: str | None  # the forced function; None: "required" (any of the tools)
    parallel: bool = True

    def schema(self) -> dict[str, Any]:
        params = {t.function.name: t.function.parameters or _ANY_OBJECT for t in self.tools}
        if self.named is not None:
            return params[self.named]
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
             "required": ["name", "arguments"], "additionalProperties": False}
            for name, schema in params.items()]}}
        return {**calls, "maxItems": 1} if not self.parallel else calls

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The tool calls in a finished generation, or ``None`` when it is not complete
        JSON (the generation was cut short by ``max_tokens``)."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        pairs = [(self.named, text)] if self.named is not None else [
            (c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in value]
        return [{"id": new_id("call"), "type": "function", "function": {"name": n, "arguments": a}}
                for n, a in pairs]


_AUTO_INSTEAD: Final = ('send tool_choice "required" or {"type": "function", "function": {"name": ...}} '
                        '(enforced with structured outputs), or "none"')


def auto_tool_choice_refused(renders_tools: bool | None, model: str = "the served model",
                             why: str = "") -> ApiError:
    """The 400 for ``tool_choice: "auto"``: the model would have to write tool calls in its
    chat template's own format, for a parser to find. ``renders_tools`` is whether that
    template renders the tools at all (``None``: not known; ``why`` says why not)."""
    if renders_tools is False:
        what = (f"{model}'s chat template has no tool support (it never renders the tools it is "
                "given), so the model has no tool-call format to parse")
    elif renders_tools:
        what = (f"{model}'s chat template renders tools, but this gateway has no parser for its "
                "tool-call format")
    else:
        what = "this gateway cannot tell whether the model's chat template supports tools" + (
            f" ({why})" if why else "")
    return ApiError(400, f'tool_choice "auto" (the default with tools) needs a chat template with '
                    f"tool support: {what}. Instead, {_AUTO_INSTEAD}", param="tool_choice")


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def wants_auto_tools(self) -> bool:
        """Whether the model is to decide by itself whether to call a tool (``tool_choice``
        ``"auto"``, the default with tools)."""
        return bool(self.tools) and self.tool_choice in (None, "auto")

    def tool_calling(self) -> ToolCalling | None:
        """How this request calls tools (``None``: it answers text); refused with a 400
        naming the field where it cannot be honoured."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none"):
                raise ApiError(400, "tool_choice needs tools", param="tool_choice")
            return None
        names = [t.function.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ApiError(400, "tools: function names must be unique", param="tools")
        if choice == "none":
            return None
        if self.wants_auto_tools():
            raise auto_tool_choice_refused(None)
        if self.n is not None and self.n != 1:
            raise ApiError(400, "n must be 1 with tools", param="n")
        if self.guide() is not None:
            raise ApiError(400, "tools are answered with structured outputs: leave out "
                           f"{self.guide()[0]}", param="tool_choice")  # type: ignore[index]
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in names:
                raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not one of "
                               f"tools ({', '.join(names)})", param="tool_choice")
            return ToolCalling(tuple(self.tools), choice.function.name)
        return ToolCalling(tuple(self.tools), None, self.parallel_tool_calls is not False)

    def to_request(self) -> Request:
        self._refuse_unsupported()
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "give max_completion_tokens or max_tokens, not both",
                           param="max_completion_tokens")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        sampling = self._sampling(limit)
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.logprobs:
            sampling.update(logprobs=True, top_logprobs=self.top_logprobs)
        if (calling := self.tool_calling()) is not None:
            sampling["json_schema"] = calling.schema()
        return Request(messages=[_message(i, m) for i, m in enumerate(self.messages)], **sampling)


def _message(index: int, msg: dict[str, Any]) -> dict[str, Any]:
    """One chat message with its content as plain text (text parts are joined); an
    assistant's ``tool_calls`` and a tool message's ``tool_call_id`` go on to the server's
    chat template (``contract.parse_messages`` checks them)."""
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported",
                               param="messages")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is None:
        content = ""
    out: dict[str, Any] = {"role": msg.get("role"), "content": content}
    for key in ("name", "tool_calls", "tool_call_id"):
        if msg.get(key) is not None:
            out[key] = msg[key]
    return out


class CompletionRequest(_Sampling):
    """``POST /v1/completions`` (one text prompt)."""

    prompt: str | list[str] | list[int]
    logprobs: int | None = None  # the number of most likely tokens per position (0: the chosen only)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def to_request(self) -> Request:
        self._refuse_unsupported()
        if self.echo:
            raise ApiError(400, "echo is not supported by this server", param="echo")
        if self.suffix:
            raise ApiError(400, "suffix is not supported by this server", param="suffix")
        if self.best_of is not None and self.best_of != 1:
            raise ApiError(400, f"best_of must be 1; got {self.best_of}", param="best_of")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise ApiError(400, "prompt must be one string (batches and token ids are not supported)",
                               param="prompt")
            prompt = prompt[0]
        sampling = self._sampling(self.max_tokens)
        if self.logprobs is not None:
            sampling.update(logprobs=True, top_logprobs=self.logprobs)
        return Request(prompt=prompt, **sampling)


def parse(model: type[_Sampling], body: Any) -> Any:
    """Validate a JSON body into ``model``; an :class:`ApiError` naming the field otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ApiError(400, f"{loc}: {err['msg']}", param=str(err["loc"][0]) if err["loc"] else None) from None


# ======================================================================================
def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _finish(reason: FinishReason) -> str | None:
    # A cancelled request never reaches its reader, so only stop/length appear.
    return reason.value or None


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    return {"content": [{**_token(t.token, t.logprob), "top_logprobs": [_token(a, v) for a, v in t.top]}
                        for t in tokens], "refusal": None}


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A completion choice's (legacy) ``logprobs``: tokens, token_logprobs, top_logprobs and
    text_offset (from ``offset``, the characters before these tokens)."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens], "text_offset": offsets}


def chat_choice(index: int, text: str, finish: FinishReason, tool_calls: list[dict[str, Any]] | None = None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One of a chat completion's ``choices`` (tool calls replace the content)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls is not None:
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": "tool_calls" if tool_calls is not None else _finish(finish)}


def chat_response(rid: str, created: int, model: str, choices: list[dict[str, Any]],
                  prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, Any],
               finish: FinishReason | str | None = None, *, include_usage: bool = False,
               logprobs: dict[str, Any] | None = None, index: int = 0) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (``usage: null`` on each when usage comes last)."""
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": _finish(finish) if isinstance(finish, FinishReason) else finish,
        }],
    }
    if include_usage:
        out["usage"] = None
    return out


def tool_call_delta(index: int, call: dict[str, Any] | None = None, arguments: str = "") -> dict[str, Any]:
    """A chat chunk's delta carrying tool call ``index``: its id, type and name with the
    first piece (``call``), only the next piece of its arguments after."""
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call is not None:
        piece.update(id=call["id"], type="function",
                     function={"name": call["function"]["name"], "arguments": arguments})
    return {"tool_calls": [piece]}


def usage_chunk(obj: str, rid: str, created: int, model: str, use: dict[str, int]) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage``: no choices, the whole usage."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def completion_choice(index: int, text: str, finish: FinishReason,
                      logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": _finish(finish)}


def completion_response(rid: str, created: int, model: str, choices: list[dict[str, Any]],
                        prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish: FinishReason | None = None,
                     *, include_usage: bool = False, logprobs: dict[str, Any] | None = None,
                     index: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": None if finish is None else _finish(finish),
        }],
    }
    if include_usage:
        out["usage"] = None
    return out


def model_card(name: str, created: int | None = None, parent: str | None = None) -> dict[str, Any]:
    """One entry of ``GET /v1/models`` (``root`` is read by vLLM's benchmark client); a LoRA
    adapter's has the served model as its ``parent``, as vLLM's server lists them."""
    return {
        "id": name,
        "object": "model",
        "created": int(time.time()) if created is None else created,
        "owned_by": OWNER,
        "root": parent or name,
        "parent": parent,
    }
