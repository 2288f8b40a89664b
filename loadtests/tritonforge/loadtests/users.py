"""Locust users for a tritonforge deployment: gRPC streaming, HTTP SSE, HTTP non-streaming.

Importing this module imports Locust (which monkey-patches the process with gevent) and
makes gRPC gevent-compatible (``grpc.experimental.gevent.init_gevent()``, before any
channel exists). Load it from a locustfile only, never from a test or CLI process.

Every request reports to Locust's statistics as separate named entries, so the web UI and
the CSVs show them side by side (``Type`` is the user's ``label``):

* ``time_to_first_token`` -- first response minus send time;
* ``inter_token_latency`` -- (latency - TTFT) / (output tokens - 1) (streaming users);
* ``request_latency`` -- send to last response; its ``response_length`` (Locust's
  "content size" column) is the number of output tokens, counted by re-tokenizing the
  returned text with the served model's tokenizer. Failures are reported here only.

A request succeeds on meaning: a stream that ends without any token is a failure.

Subclass :class:`TritonForgeUser` (or one of the concrete users) and set the documented
class attributes to configure a user in code; attributes left at ``None`` take the
command-line settings (``--model``, ``--max-tokens``, ``--dataset`` ...).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import gevent  # type: ignore[import-untyped]
import grpc.experimental.gevent as grpc_gevent
from gevent import GreenletExit
from locust import User, constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import LocustError, StopUser
from tritonforge.clients import Client, Request, TritonForgeError, _wire
from tritonforge.clients._http import error_text, status_error
from tritonforge.loadtests.datasets import Prompt, PromptPool, cached_prompts
from tritonforge.loadtests.options import Settings
from tritonforge.loadtests.records import Record
from tritonforge.loadtests.session import STATE
from tritonforge.loadtests.tokens import load_token_counter

__all__ = [
    "ENTRY_ITL",
    "ENTRY_LATENCY",
    "ENTRY_TTFT",
    "GrpcStreamUser",
    "HttpGenerateUser",
    "HttpStreamUser",
    "Outcome",
    "RequestFailed",
    "TritonForgeUser",
]

grpc_gevent.init_gevent()
# gRPC's gevent integration waits for each call's next message on a thread of the hub's
# thread pool; its default size (10) would cap the streams in flight, whatever the users.
_pool = gevent.get_hub().threadpool
_pool.maxsize = max(_pool.maxsize, int(os.environ.get("TRITONFORGE_GRPC_THREADS", "512")))

ENTRY_TTFT = "time_to_first_token"
ENTRY_ITL = "inter_token_latency"
ENTRY_LATENCY = "request_latency"


class RequestFailed(Exception):
    """What a failed request reports to Locust (the message says what went wrong)."""


@dataclass(frozen=True)
class Outcome:
    """What one transport call returned: text, TTFT and latency (s), error ("" if none)."""

    text: str
    ttft: float | None
    latency: float
    error: str = ""


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class TritonForgeUser(User):
    """Abstract base: one closed-loop user sending one request after another.

    Class attributes (``None``: take the command-line setting):

    * ``model`` -- the ensemble to call (``--model``); required.
    * ``max_tokens`` -- output tokens to ask for (``--max-tokens``; else each prompt's own).
    * ``dataset`` -- ``short-chat`` | ``long-summarization`` | ``mixed-zh-en`` |
      ``synthetic:N`` | a JSONL path (``--dataset``).
    * ``tokenizer`` -- the served model's tokenizer reference (``--tokenizer``).
    * ``request_timeout`` -- per-request deadline in seconds (``--request-timeout``).
    * ``label`` -- the ``Type`` column of Locust's statistics.
    * ``streaming`` -- whether the user streams (ITL is defined only then).
    """

    abstract = True
    wait_time = constant(0)

    model: ClassVar[str | None] = None
    max_tokens: ClassVar[int | None] = None
    dataset: ClassVar[str | None] = None
    tokenizer: ClassVar[str | None] = None
    request_timeout: ClassVar[float | None] = None
    label: ClassVar[str] = "llm"
    streaming: ClassVar[bool] = True

    _instances: ClassVar[int] = 0

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        s = STATE.settings
        cls = type(self)
        self.cfg_model: str = self._setting(cls.model, s.model if s else "", "model", "--model")
        self.cfg_max_tokens = cls.max_tokens if cls.max_tokens is not None else (
            s.max_tokens if s else None)
        self.cfg_dataset: str = self._setting(cls.dataset, s.dataset if s else "", "dataset",
                                              "--dataset")
        self.cfg_tokenizer: str = self._setting(cls.tokenizer, s.tokenizer if s else "",
                                                "tokenizer", "--tokenizer")
        self.cfg_timeout: float = float(cls.request_timeout if cls.request_timeout is not None
                                        else (s.request_timeout if s else 300.0))
        seed = s.prompt_seed if s else 0
        self.counter = load_token_counter(self.cfg_tokenizer)
        prompts = cached_prompts(self.cfg_dataset, self.cfg_tokenizer,
                                 max_tokens=self.cfg_max_tokens, seed=seed)
        TritonForgeUser._instances += 1
        self.pool = PromptPool(prompts, seed=seed * 100_003 + TritonForgeUser._instances)

    def _setting(self, value: Any, fallback: Any, attr: str, flag: str) -> Any:
        v = value if value is not None else fallback
        if v in (None, ""):
            raise LocustError(f"{type(self).__name__}.{attr} is not set: set the class attribute"
                              f" or pass {flag}")
        return v

    def request_for(self, prompt: Prompt) -> Request:
        return Request(prompt=prompt.prompt, messages=prompt.messages,
                       max_tokens=self.cfg_max_tokens or prompt.max_tokens,
                       stream=self.streaming, timeout=self.cfg_timeout)

    def send(self, prompt: Prompt) -> Outcome:  # pragma: no cover - abstract
        raise NotImplementedError

    @task
    def generate(self) -> None:
        prompt = self.pool.next()
        start = time.time()
        t0 = time.perf_counter()
        try:
            outcome = self.send(prompt)
        except (GreenletExit, StopUser):
            raise  # the test is stopping: an interrupted request is not a result
        except Exception as exc:  # noqa: BLE001 - a bug or an untranslated error: count it, keep going
            outcome = Outcome("", None, time.perf_counter() - t0, _describe(exc))
        self.report(prompt, start, outcome)

    def report(self, prompt: Prompt, start: float, outcome: Outcome) -> Record:
        """Judge the outcome, fire the named Locust entries and hand the record on."""
        tokens = self.counter.count(outcome.text) if not outcome.error else 0
        error = outcome.error
        if not error and tokens == 0:
            error = "the response ended with no tokens" if self.streaming else "empty response"
        rec = Record(start=start, ttft=outcome.ttft if not error else None,
                     latency=outcome.latency, output_tokens=tokens,
                     input_tokens=prompt.input_tokens, error=error, streaming=self.streaming)
        fire = self.environment.events.request.fire
        ms = 1000.0
        if rec.ok:
            if rec.ttft is not None:
                fire(request_type=self.label, name=ENTRY_TTFT, response_time=rec.ttft * ms,
                     response_length=0, exception=None, context={}, start_time=start)
            if rec.itl is not None:
                fire(request_type=self.label, name=ENTRY_ITL, response_time=rec.itl * ms,
                     response_length=0, exception=None, context={}, start_time=start)
        fire(request_type=self.label, name=ENTRY_LATENCY, response_time=rec.latency * ms,
             response_length=tokens, exception=RequestFailed(error) if error else None,
             context={}, start_time=start)
        STATE.record(rec)
        return rec


# ----------------------------------------------------------------------------------------
_clients_lock = threading.Lock()
_clients: dict[tuple[str, str], Client] = {}


def shared_client(url: str, model: str, timeout: float) -> Client:
    """One typed gRPC client (one channel) per address and model, shared by all users."""
    with _clients_lock:
        key = (url, model)
        if key not in _clients:
            _clients[key] = Client(url, protocol="grpc", model=model, timeout=timeout,
                                   connect_retries=0)
        return _clients[key]


def close_clients() -> None:
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for c in clients:
        c.close()


def _close_clients_at_exit(**_kw: Any) -> None:
    close_clients()


events.quitting.add_listener(_close_clients_at_exit)  # type: ignore[no-untyped-call]


class GrpcStreamUser(TritonForgeUser):
    """Streams over gRPC (``ModelStreamInfer``) through the typed sync client.

    ``url`` (``HOST:PORT``; ``None``: ``--triton-grpc``) is the gRPC address.
    """

    label = "grpc-stream"
    url: ClassVar[str | None] = None

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        s: Settings | None = STATE.settings
        url = self._setting(type(self).url, s.grpc_url if s else "", "url", "--triton-grpc")
        self.client_ = shared_client(url, self.cfg_model, self.cfg_timeout)

    def send(self, prompt: Prompt) -> Outcome:
        t0 = time.perf_counter()
        try:
            with self.client_.stream(self.request_for(prompt)) as s:
                for _ in s:
                    pass
                c = s.completion
        except TritonForgeError as exc:
            return Outcome("", None, time.perf_counter() - t0, _describe(exc))
        return Outcome(c.text, c.ttft, c.latency)


def _http_base(s: Settings | None, url: str | None) -> str:
    u = url or (s.http_url if s else "")
    if not u:
        return ""
    return u if u.startswith(("http://", "https://")) else f"http://{u}"


def _abort(response: Any) -> None:
    """Drop a half-read streamed response's connection (never reuse it)."""
    ghc = getattr(response, "_response", None)
    sock, pool = getattr(ghc, "_sock", None), getattr(ghc, "_pool", None)
    if ghc is not None and sock is not None:
        ghc._sock = None
        if pool is not None:
            pool.release_socket(sock)
        else:
            sock.close()


def _http_error(response: Any) -> str:
    """The failure of a refused HTTP reply, classified by the clients' one error parser."""
    err = getattr(response, "error", None)
    if err is not None and not getattr(response, "status_code", 0):
        return _describe(err)
    body = (response.content or b"").decode("utf-8", errors="replace")
    return _describe(status_error(response.status_code, error_text(body)))


class HttpStreamUser(FastHttpUser, TritonForgeUser):
    """Streams over HTTP SSE (``POST /v2/models/<model>/generate_stream``) with Locust's
    own fast HTTP client; events are read line by line as they arrive.

    ``host`` (``http://HOST:PORT``; ``None``: ``--triton-http``) is the HTTP address.
    """

    label = "http-sse"

    def __init__(self, environment: Any) -> None:
        if not type(self).host:
            type(self).host = _http_base(STATE.settings, None) or None
        super().__init__(environment)

    def send(self, prompt: Prompt) -> Outcome:
        body = json.dumps(_wire.http_body(self.request_for(prompt)), ensure_ascii=False)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                   "Accept-Encoding": "identity"}
        path = f"/v2/models/{self.cfg_model}/generate_stream"
        t0 = time.perf_counter()
        resp = self.client.request("POST", path, data=body, headers=headers, stream=True,
                                   catch_response=True, name=path)  # reported by us, not Locust
        if getattr(resp, "error", None) is not None or resp.status_code != 200:
            if getattr(resp, "error", None) is None:
                resp.content  # noqa: B018 - read the error body
            return Outcome("", None, time.perf_counter() - t0, _http_error(resp))
        ghc = resp._response
        assert ghc is not None  # a streamed 200 reply keeps its socket response
        texts: list[str] = []
        ttft: float | None = None
        done = False
        try:
            while True:
                line = ghc.readline(b"\n")
                if not line:
                    break
                if not line.startswith(b"data:"):
                    continue
                event = _wire.sse_event(line[5:].strip().decode("utf-8"))
                if event.text or event.tokens:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    texts.append(event.text)
            done = True
        except TritonForgeError as exc:
            return Outcome("", None, time.perf_counter() - t0, _describe(exc))
        except OSError as exc:
            return Outcome("", None, time.perf_counter() - t0, _describe(exc))
        finally:
            if not done:
                _abort(resp)
        return Outcome("".join(texts), ttft, time.perf_counter() - t0)


class HttpGenerateUser(FastHttpUser, TritonForgeUser):
    """One request, one response: ``POST /v2/models/<sync_model>/generate`` (the
    non-decoupled ``<model>_sync`` twin). TTFT equals the latency; ITL is not defined.

    ``sync_model`` (``None``: ``--sync-model``, default ``<model>_sync``).
    """

    label = "http-generate"
    streaming = False
    sync_model: ClassVar[str | None] = None

    def __init__(self, environment: Any) -> None:
        if not type(self).host:
            type(self).host = _http_base(STATE.settings, None) or None
        super().__init__(environment)
        s = STATE.settings
        self.cfg_sync_model = type(self).sync_model or (s.sync_model if s else "") or (
            f"{self.cfg_model}_sync")

    def send(self, prompt: Prompt) -> Outcome:
        body = json.dumps(_wire.http_body(self.request_for(prompt)), ensure_ascii=False)
        path = f"/v2/models/{self.cfg_sync_model}/generate"
        t0 = time.perf_counter()
        resp = self.client.request("POST", path, data=body, catch_response=True, name=path,
                                   headers={"Content-Type": "application/json"})
        latency = time.perf_counter() - t0
        if getattr(resp, "error", None) is not None or resp.status_code != 200:
            return Outcome("", None, latency, _http_error(resp))
        try:
            event = _wire.sse_event((resp.content or b"").decode("utf-8"))
        except TritonForgeError as exc:
            return Outcome("", None, latency, _describe(exc))
        return Outcome(event.text, latency, latency)
