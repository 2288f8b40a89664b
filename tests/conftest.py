"""Shared fixtures: ONE real tritonserver (bundled in nvidia-pytriton) serving the default
repository (model_repository/: SmolLM2-135M-Instruct on vLLM, CPU) per test session.

Set TRITONFORGE_TEST_SERVER="http=H:P,grpc=H:P,metrics=H:P,model=NAME" to reuse a server
that is already running (handy while developing); TRITONFORGE_ADMIN_KEY then gives its admin
key.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tritonforge.runtime.procfs import descendants

if TYPE_CHECKING:
    from vllm_oracle import VllmOracle

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPO = ROOT / "model_repository"
DEFAULT_SPEC = ROOT / "deployments" / "default.yaml"


@dataclass
class ServerHandle:
    http_url: str
    grpc_url: str
    metrics_url: str
    model: str
    repo: Path
    admin_key: str | None
    log_file: Path | None = None
    server: object | None = None  # tritonforge.runtime.server.TritonServer when started here

    @property
    def engine_model(self) -> str:
        return "vllm_engine"


def _default_model_name() -> str:
    from tritonforge.cli.serve import _served_model

    name = _served_model(DEFAULT_REPO)
    if name is None:
        raise RuntimeError(f"no ensemble in {DEFAULT_REPO}")
    return name


def start_server(repo: Path, *, log_name: str) -> tuple[object, ServerHandle]:
    """Start a real tritonserver on free loopback ports and wait until it is ready, its HTTP
    port behind tritonforge's HTTP front as ``tritonforge serve`` has it (``runtime.front``):
    every HTTP test goes through the path a user's request takes."""
    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.runtime.server import ServerOptions, TritonServer, free_port

    resolve_model("package:smollm2-135m-instruct")  # prepared once, cached
    log = cache_dir() / "logs" / f"{log_name}-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    opts = ServerOptions(
        repository=repo,
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_file=log,
        front=True,
    )
    server = TritonServer(opts)
    try:
        server.start_ready(timeout=600)
    except Exception:
        server.stop()
        raise
    handle = ServerHandle(
        http_url=opts.http_url,
        grpc_url=opts.grpc_url,
        metrics_url=opts.metrics_url,
        model="",
        repo=repo,
        admin_key=server.admin_key,
        log_file=log,
        server=server,
    )
    return server, handle


@pytest.fixture(scope="session")
def triton_server() -> Iterator[ServerHandle]:
    reuse = os.environ.get("TRITONFORGE_TEST_SERVER")
    if reuse:
        parts = dict(p.split("=", 1) for p in reuse.split(","))
        yield ServerHandle(
            http_url=parts["http"],
            grpc_url=parts["grpc"],
            metrics_url=parts["metrics"],
            model=parts.get("model") or _default_model_name(),
            repo=DEFAULT_REPO,
            admin_key=os.environ.get("TRITONFORGE_ADMIN_KEY"),
        )
        return
    server, handle = start_server(DEFAULT_REPO, log_name="test-server")
    handle.model = _default_model_name()
    try:
        yield handle
    finally:
        server.stop()  # type: ignore[attr-defined]


def _shared_server_death(handle: ServerHandle) -> str | None:
    """Why the shared server is gone (its exit status and the log's tail), or None."""
    proc = getattr(handle.server, "process", None)
    if proc is None or proc.poll() is None:
        return None
    code = proc.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    tail = ""
    if handle.log_file is not None:
        with contextlib.suppress(OSError):
            tail = "\n".join(handle.log_file.read_text(errors="replace").splitlines()[-60:])
    return f"the shared tritonserver died ({how}); its log ({handle.log_file}) ends:\n{tail}"


def _restart_shared_server(handle: ServerHandle) -> None:
    """Start the dead shared server again on its ports, so that one crash fails one test,
    not every later one."""
    server = handle.server
    server.stop()  # type: ignore[attr-defined]  # clears what is left of its process group
    server.start_ready(timeout=600)  # type: ignore[attr-defined]


# After a test on the shared server failed, the server must still answer a one-token request
# within this many seconds, or it is started again (a wedged server -- e.g. Triton 2.51's Python
# backend after a stub missed its health deadline -- would fail every later test by timeout).
WEDGE_PROBE_SECONDS = 120.0


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"report_{report.when}", report)  # read by _shared_server_alive
    return report


def _shared_server_wedged(handle: ServerHandle) -> str | None:
    """Why the (running) shared server cannot serve: a one-token request through the
    ensemble failed or took over WEDGE_PROBE_SECONDS; None when it answered."""
    from tritonforge.clients import Client, TritonForgeError

    try:
        with Client(handle.grpc_url, model=handle.model, timeout=WEDGE_PROBE_SECONDS) as client:
            client.complete("Hello", max_tokens=1)
    except TritonForgeError as exc:
        return f"the shared server no longer serves a one-token request ({type(exc).__name__}: {exc})"
    return None


# Fixtures that yield a ServerHandle of a server this suite started and keeps for several
# tests (the session's shared server; the TensorRT-LLM modules' own): each is guarded alike.
GUARDED_SERVERS = ("triton_server", "cpp", "llmapi", "lora")


def _handle_of(value: object) -> ServerHandle:
    """The ServerHandle a guarded fixture yields: the value itself, or the first ServerHandle
    of the tuple a module's fixture yields with it (``llmapi``: handle, record; ``lora``:
    handle, adapter ids, rows)."""
    if isinstance(value, ServerHandle):
        return value
    if isinstance(value, tuple):
        for part in value:
            if isinstance(part, ServerHandle):
                return part
    raise TypeError(f"a guarded fixture yielded {type(value).__name__}, not a ServerHandle")


@pytest.fixture(autouse=True)
def _shared_server_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses a kept server (``GUARDED_SERVERS``) fails, with the server's own
    account (exit status, log tail), when the server is gone; the server is then started
    again for the tests after it (instead of dozens of bare 'connection refused'). After the
    test, what makes ``serve`` restart a server (``TritonServer.failure``: a model asked for
    it, a stub or engine died, a model is wedged) restarts it too; and after a test that
    failed, the server must still serve (``_shared_server_wedged``), else it is started
    again."""
    handles = [
        _handle_of(request.getfixturevalue(name))
        for name in GUARDED_SERVERS
        if name in request.fixturenames
    ]
    for handle in handles:
        if (why := _shared_server_death(handle)) is not None:
            _restart_shared_server(handle)
            pytest.fail(f"before {request.node.nodeid}: {why}", pytrace=False)
    yield
    for handle in handles:
        if (why := _shared_server_death(handle)) is not None:
            _restart_shared_server(handle)
            pytest.fail(f"during {request.node.nodeid}: {why}", pytrace=False)
        if handle.server is not None:
            # what makes ``serve`` restart a server (a model asked for it after a stall that
            # may have broken Triton's Python backend, a dead stub or engine, a wedged model):
            # the same here, so that the next test does not set off what this one left
            why, tail = handle.server.failure()  # type: ignore[attr-defined]
            if why is not None:
                print(f"\nafter {request.node.nodeid}: {why}; starting the server again\n{tail}")
                _restart_shared_server(handle)
        report = getattr(request.node, "report_call", None)
        if (report is not None and report.failed and handle.server is not None
                and (why := _shared_server_wedged(handle)) is not None):
            _restart_shared_server(handle)
            pytest.fail(f"after {request.node.nodeid}: {why}; started it again", pytrace=False)


def metric(metrics_url: str, name: str, *, required: bool = False, **labels: str) -> float:
    """Sum of a series on the server's /metrics over the label sets matching ``labels``.
    A series that is not exported at all fails, unless ``labels`` narrow it and it is not
    ``required`` (a labelled counter Triton only shows once it has counted)."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            seen = True
    assert seen or (labels and not required), f"{name} is not exported on {metrics_url}/metrics"
    return total


def engine_gauge(metrics_url: str, name: str = "tritonforge_engine_requests_running") -> float:
    """A tritonforge engine gauge on the server's metrics endpoint, summed over label sets."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and not line.startswith("#")
    ]
    assert values, f"{name} is not exported on {metrics_url}/metrics"
    return sum(values)


def wait_engine_gauge(
    metrics_url: str,
    predicate: Callable[[float], bool],
    seconds: float = 5.0,
    name: str = "tritonforge_engine_requests_running",
) -> float:
    """Poll the gauge until ``predicate`` holds or ``seconds`` pass; return the last value."""
    deadline = time.monotonic() + seconds
    value = engine_gauge(metrics_url, name)
    while not predicate(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = engine_gauge(metrics_url, name)
    return value


@dataclass
class ServeProcess:
    """``tritonforge serve`` of the default repository, run as a user runs it (a subprocess)."""

    proc: subprocess.Popen[str]
    http_url: str
    grpc_url: str
    metrics_url: str
    model: str
    log: Path
    lines: list[str] = field(default_factory=list)  # serve's output so far (read by a thread)
    _reader: threading.Thread | None = None

    def read_output(self) -> None:
        """Collect serve's output as it comes (a full pipe would block serve)."""
        def drain() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)

        self._reader = threading.Thread(target=drain, daemon=True)
        self._reader.start()

    def output(self) -> str:
        """serve's output so far (all of it once serve has exited)."""
        if self.proc.poll() is not None and self._reader is not None:
            self._reader.join(10)
        return "".join(self.lines)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_metrics(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def wait_ready(self, seconds: float = 600) -> None:
        deadline = time.monotonic() + seconds
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited early:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve was not ready in {seconds:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextlib.contextmanager
def serve_process(log: Path) -> Iterator[ServeProcess]:
    """Start ``tritonforge serve`` on free loopback ports; stop it (SIGINT) afterwards."""
    from tritonforge.runtime.server import free_port

    ports = [free_port() for _ in range(3)]
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "tritonforge"), "serve", "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--log-file", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    s = ServeProcess(proc, f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}",
                     f"127.0.0.1:{ports[2]}", _default_model_name(), log)
    s.read_output()
    try:
        s.wait_ready()
        s.wait_metrics()
        yield s
    finally:
        s.stop()


@contextlib.contextmanager
def serve_spec(spec: dict[str, object], tmp: Path, what: str) -> Iterator[dict[str, object]]:
    """``tritonforge serve SPEC`` (``spec`` written to ``tmp``; vLLM forced eager) on free
    loopback ports, as a user runs it (its own session, ``--open-admin``); yields its
    addresses, ``serve``'s output file and the tritonserver log it names; Ctrl-C (SIGINT)
    afterwards."""
    import re
    import sys

    import yaml
    from tritonforge.runtime.server import free_port

    if spec.get("backend", "vllm") == "vllm":
        # Knob servers run vLLM eager: their oracles are offline vLLM in eager mode (compiled
        # kernels may round differently), and an eager engine is ready in ~20 s, not ~60.
        spec = {**spec, "vllm": {**dict(spec.get("vllm") or {}), "enforce_eager": True}}  # type: ignore[arg-type]
    path = tmp / f"{what}.yaml"
    path.write_text(yaml.safe_dump(spec))
    ports = [free_port() for _ in range(3)]
    log = tmp / "serve.log"
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "tritonforge"), "serve", str(path), "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--open-admin"],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while "serving; Ctrl-C to stop" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "serve not ready in 900 s"
            time.sleep(0.5)
        print(f"\n{what} server ready in {time.monotonic() - started:.0f} s")
        server_log = re.search(r"^\s*log (\S+)$", log.read_text(), re.MULTILINE)
        assert server_log, log.read_text()
        yield {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}",
               "metrics": f"127.0.0.1:{ports[2]}", "log": log, "spec": path,
               "server_log": Path(server_log.group(1))}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process below it, read from /proc
    (the operating system's account, not the server's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in (pid, *descendants(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def tree_cpu_rate(pid: int, seconds: float = 0.5) -> float:
    """Cores the process tree under ``pid`` used over the next ``seconds``."""
    before = tree_cpu_seconds(pid)
    time.sleep(seconds)
    return (tree_cpu_seconds(pid) - before) / seconds


def chat_prompt_ids(messages: list[dict[str, str]]) -> list[int]:
    """The token ids the default model's own chat template gives ``messages`` (with the
    generation prompt): what the oracle is asked for a chat request, so that which answer the
    model gives on this CPU (its bf16 kernels decide the greedy text) is never written down."""
    from tritonforge.triton_models.preprocess import load_tokenizer

    tok = load_tokenizer("package:smollm2-135m-instruct")
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(rendered, add_special_tokens=False))


def default_engine_args() -> dict[str, object]:
    """The vLLM engine arguments of the default repository (its engine model's config)."""
    import json

    from google.protobuf import text_format  # type: ignore[import-untyped]
    from tritonclient.grpc import model_config_pb2 as mc  # type: ignore[import-untyped]
    from tritonforge.contract import MODEL_VLLM_ENGINE, Param

    cfg = text_format.Parse((DEFAULT_REPO / MODEL_VLLM_ENGINE / "config.pbtxt").read_text(), mc.ModelConfig())
    return dict(json.loads(cfg.parameters[Param.ENGINE_ARGS.value].string_value))


def start_oracle(engine_args: dict[str, object] | None = None) -> VllmOracle:
    """vLLM's offline LLM API in its own process, on the default model (see vllm_oracle);
    without ``engine_args``, with the default repository's own engine arguments (compiled,
    chunked prefill, ...), so that it computes as the shared server's engine does."""
    from tritonforge.runtime.models import resolve_model
    from tritonforge.runtime.server import find_install, server_environment
    from vllm_oracle import VllmOracle

    folder = resolve_model("package:smollm2-135m-instruct")
    env = server_environment(find_install(), {"VLLM_CPU_KVCACHE_SPACE": "1"})
    return VllmOracle(folder, default_engine_args() if engine_args is None else engine_args, env)


@pytest.fixture(scope="session")
def vllm_oracle() -> Iterator[VllmOracle]:
    """One offline vLLM per test session, with the default repository's engine arguments: the
    reference output the shared server (and every server of the default repository) is
    compared with."""
    oracle = start_oracle()
    try:
        yield oracle
    finally:
        oracle.close()


@pytest.fixture(scope="session")
def vllm_oracle_eager() -> Iterator[VllmOracle]:
    """Offline vLLM in eager mode, for the servers that run vLLM eager (the knob servers of
    ``serve_spec``, the TensorRT-LLM LLM-API stand-in). Measured: compiled and eager vLLM 0.32
    on this CPU gave different greedy text for 5 of 8 prompts (some from the 5th token), so
    each server is compared with an oracle that computes as it does."""
    oracle = start_oracle({})
    try:
        yield oracle
    finally:
        oracle.close()
