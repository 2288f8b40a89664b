"""Locust users for a tritonforge deployment: gRPC streaming, HTTP SSE, HTTP non-streaming.

Importing this module imports Locust (which monkey-patches the process with gevent). Load
it from a locustfile only, never from a test or CLI process. The gRPC user runs its
streams in a child process on grpc's asyncio (:mod:`tritonforge.loadtests.grpc_worker`),
not through gRPC's gevent integration, which handed every streamed message to the hub.

Each logical request is ONE Locust request event, so Locust's request count, RPS and
failure ratio (the "Aggregated" row, the CSVs, the web UI) count requests, not entries:

* ``request_latency`` (``Type`` = the user's ``label``) -- send to last response; its
  ``response_length`` (Locust's "content size" column) is the number of output tokens,
  counted by re-tokenizing the returned text with the served model's tokenizer. Failures
  are reported here only.

Two more entries show the token timings of the successful requests next to it, under their
own ``Type`` (``<label>/timing``, see :func:`timing_type`). They are logged into Locust's
statistics table directly, not fired as request events, so they do not add to the
aggregated row (nor to other request listeners); in distributed mode they travel to the
master with the other entries:

* ``time_to_first_token`` -- first response minus send time;
* ``inter_token_latency`` -- (latency - TTFT) / (output tokens - 1) (streaming users).

A request succeeds on meaning: a stream that ends without any token is a failure.

Subclass :class:`TritonForgeUser` (or one of the concrete users) and set the documented
class attributes to configure a user in code; attributes left at ``None`` take the
command-line settings (``--model``, ``--max-tokens``, ``--dataset`` ...).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import gevent  # type: ignore[import-untyped]
from gevent import GreenletExit
from gevent.event import AsyncResult  # type: ignore[import-untyped]
from gevent.lock import BoundedSemaphore  # type: ignore[import-untyped]
from locust import User, constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import LocustError, StopUser
from tritonforge.clients import Request, TritonForgeError, _wire
from tritonforge.clients._http import error_text, status_error
from tritonforge.loadtests.datasets import Prompt, PromptPool, cached_prompts
from tritonforge.loadtests.grpc_worker import describe_error, request_fields
from tritonforge.loadtests.metrics import ENTRY_ITL, ENTRY_LATENCY, ENTRY_TTFT, timing_type
from tritonforge.loadtests.options import Settings
from tritonforge.loadtests.records import Record
from tritonforge.loadtests.session import STATE
from tritonforge.loadtests.tokens import load_token_counter

__all__ = [
    "ENTRY_ITL",
    "ENTRY_LATENCY",
    "ENTRY_TTFT",
    "GrpcStreamUser",
    "GrpcTransport",
    "HttpGenerateUser",
    "HttpStreamUser",
    "Outcome",
    "RequestFailed",
    "TritonForgeUser",
    "timing_type",
]



class RequestFailed(Exception):
    """What a failed request reports to Locust (the message says what went wrong)."""


@dataclass(frozen=True)
class Outcome:
    """What one transport call returned: text, TTFT and latency (s), error ("" if none)."""

    text: str
    ttft: float | None
    latency: float
    error: str = ""


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
        self.cfg_ignore_eos = bool(s.ignore_eos) if s else False
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
        max_tokens = self.cfg_max_tokens or prompt.max_tokens
        return Request(prompt=prompt.prompt, messages=prompt.messages, max_tokens=max_tokens,
                       min_tokens=max_tokens if self.cfg_ignore_eos else None,
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
            outcome = Outcome("", None, time.perf_counter() - t0, describe_error(exc))
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
        ms = 1000.0
        if rec.ok:
            stats = self.environment.stats
            kind = timing_type(self.label)
            if rec.ttft is not None:
                stats.get(ENTRY_TTFT, kind).log(rec.ttft * ms, 0)
            if rec.itl is not None:
                stats.get(ENTRY_ITL, kind).log(rec.itl * ms, 0)
        self.environment.events.request.fire(
            request_type=self.label, name=ENTRY_LATENCY, response_time=rec.latency * ms,
            response_length=tokens, exception=RequestFailed(error) if error else None,
            context={}, start_time=start)
        STATE.record(rec)
        return rec


# ----------------------------------------------------------------------------------------
class GrpcTransport:
    """This process's side of :mod:`~tritonforge.loadtests.grpc_worker`: one child process
    per (address, model), shared by every gRPC user of this Locust process."""

    def __init__(self, url: str, model: str, timeout: float) -> None:
        # gevent's subprocess: the pipes are cooperative, a greenlet waits, not the process.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.loadtests.grpc_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._lock = BoundedSemaphore(1)
        self._pending: dict[int, Any] = {}
        self._next = 0
        self._send({"url": url, "model": model, "timeout": timeout})
        self._reader = gevent.spawn(self._read)

    def _send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode()
        with self._lock:  # one line at a time: a cooperative write may yield mid-line
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            waiter = self._pending.pop(msg["id"], None)
            if waiter is not None:
                waiter.set(msg)
        for waiter in self._pending.values():
            waiter.set({"text": "", "ttft": None, "latency": 0.0,
                        "error": f"the gRPC worker process exited (code {self.proc.poll()})"})
        self._pending.clear()

    def call(self, request: Request) -> Outcome:
        self._next += 1
        rid = self._next
        waiter = AsyncResult()
        self._pending[rid] = waiter
        t0 = time.perf_counter()
        try:
            self._send({"id": rid, "request": request_fields(request)})
            msg = waiter.get()
        except (GreenletExit, StopUser):
            self._pending.pop(rid, None)
            try:
                self._send({"cancel": rid})
            except OSError:
                pass
            raise
        except OSError as exc:
            self._pending.pop(rid, None)
            return Outcome("", None, time.perf_counter() - t0, describe_error(exc))
        return Outcome(msg["text"], msg["ttft"], msg["latency"], msg["error"])

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


_transports: dict[tuple[str, str], GrpcTransport] = {}


def shared_transport(url: str, model: str, timeout: float) -> GrpcTransport:
    """One gRPC worker child per address and model, shared by all users of this process."""
    key = (url, model)
    if key not in _transports:
        _transports[key] = GrpcTransport(url, model, timeout)
    return _transports[key]


def close_transports() -> None:
    transports = list(_transports.values())
    _transports.clear()
    for t in transports:
        t.close()


def _close_transports_at_exit(**_kw: Any) -> None:
    close_transports()


events.quitting.add_listener(_close_transports_at_exit)  # type: ignore[no-untyped-call]


class GrpcStreamUser(TritonForgeUser):
    """Streams over gRPC (``ModelStreamInfer``) through the typed ``AsyncClient``, run by
    this process's gRPC worker child (see :class:`GrpcTransport`).

    ``url`` (``HOST:PORT``; ``None``: ``--triton-grpc``) is the gRPC address.
    """

    label = "grpc-stream"
    url: ClassVar[str | None] = None

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        s: Settings | None = STATE.settings
        url = self._setting(type(self).url, s.grpc_url if s else "", "url", "--triton-grpc")
        self.transport = shared_transport(url, self.cfg_model, self.cfg_timeout)

    def send(self, prompt: Prompt) -> Outcome:
        return self.transport.call(self.request_for(prompt))


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
        return describe_error(err)
    body = (response.content or b"").decode("utf-8", errors="replace")
    return describe_error(status_error(response.status_code, error_text(body)))


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
            return Outcome("", None, time.perf_counter() - t0, describe_error(exc))
        except OSError as exc:
            return Outcome("", None, time.perf_counter() - t0, describe_error(exc))
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
            return Outcome("", None, latency, describe_error(exc))
        return Outcome(event.text, latency, latency)
