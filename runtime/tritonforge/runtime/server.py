"""Locating, laying out, starting and stopping a real ``tritonserver``.

Two installs are supported:

* a ``tritonserver`` on ``PATH`` (an NGC container): used as it is, with its own backends;
* the server bundled in the ``nvidia-pytriton`` wheel: copied once into the cache folder with
  the Python backend stub that matches the running interpreter, and started with the
  environment it needs (see ``server_environment``): the venv's ``bin/`` first on ``PATH``
  (the stub finds numpy, tokenizers and vLLM through it) and the running interpreter's own
  ``libpython`` first on ``LD_LIBRARY_PATH`` (the stub is linked against the system's).

The server runs in its own process group, so stopping it also ends the Python backend stubs
and the engine processes they started: nothing is left behind.

Stopping drains first: the server's environment names a drain file
(``$TRITONFORGE_DRAIN_FILE``); ``stop()`` writes it, and tritonforge's engine models end every
live request with a NOT_READY "server is shutting down" error and refuse new ones. Only then
is the server signalled, so Triton finds no in-flight request to wait for (it would otherwise
wait ``--exit-timeout-secs`` for streams that may run for minutes, then exit 1).

With ``ServerOptions.front`` (``tritonforge serve``), tritonserver's HTTP port is a private
loopback one and the HTTP front (``runtime.front``, a process of its own) serves the public
port: the same API, plus the signal that a client left a non-streamed call, which Triton
2.51's HTTP frontend does not give. It is started with the server and stopped after it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.contract import (
    CANCEL_DIR_ENV,
    DRAIN_FILE_ENV,
    FRONT_KEY_PARAMETER,
    RESTART_FILE_ENV,
)
from tritonforge.runtime import adminkey
from tritonforge.runtime.paths import cache_dir
from tritonforge.triton_models.metrics import ENGINE_UP, REQUESTS_RUNNING

__all__ = [
    "ServerError",
    "ServerInstall",
    "ServerOptions",
    "TritonServer",
    "find_install",
    "free_port",
    "server_environment",
]

RESTRICTED_API_KEY_ENV = adminkey.ENV
RESTRICTED_HEADER = "admin-key"
# Triton's admin-ish endpoint groups, closed unless the admin key header is sent.
RESTRICTED_GROUPS = ("model-repository", "shared-memory", "statistics", "trace", "logging")
# How long a Python-backend stub may take to answer at start-up (see Server.command).
STUB_TIMEOUT_SECONDS = 600
# After the drain file is written: how long the engine models get to end their requests.
DRAIN_SECONDS = 0.5
# How long Triton waits at SIGTERM for in-flight requests (after the drain none are left) and
# for its models to unload (vLLM's engine gets 2 s of it, see the engine adapter). Measured on
# 2.51: after bare gRPC streams were dropped, a stop with live streams can leave the ensemble
# loaded (a reference Triton keeps); the server then exits 1 at this limit.
EXIT_TIMEOUT_SECONDS = 5


# Intermittent aborts of Triton 2.51's Python backend while models load, under heavy CPU
# load (seen here when several servers start at once; reported upstream in
# triton-inference-server/server#8882 and tensorrtllm_backend#354/#521). Nothing is wrong
# with the repository: a fresh start loads it. start_ready() restarts on these, and only
# these, a bounded number of times.
KNOWN_START_CRASHES = ("boost::interprocess::lock_exception",)
# The same backend can also miss a stub's start-up handshake under load and then wait for
# it forever (seen with gdb in StubLauncher::Launch): the log stops growing and no model is
# ever ready. start_ready() treats this many seconds of a silent log before ready as that
# stall. Loading prints steadily (vLLM's engine start, each model's load lines); the
# longest silence seen in a healthy start here was ~100 s, at a load average of 18.
STALL_SECONDS = 300.0


# The commonest stall, seen with gdb: the backend gives a starting stub 1 s to show it is
# alive (StubLauncher::ReceiveMessageFromStub); a stub starved of CPU for that second is
# declared unhealthy, and the backend then waits in wait4() for a stub that was never told
# to exit -- for ever, and before it logs why. start_ready() restarts once a tritonserver
# thread has waited this long in wait4() on one of its own stubs, instead of waiting for
# STALL_SECONDS of silence.
STUB_WAIT_SECONDS = 10.0

# A model is wedged when requests wait for it (Triton's ``nv_inference_pending_request_count``
# > 0), it has finished no execution (``nv_inference_exec_count`` unchanged) and no engine
# request has been running (``tritonforge_engine_requests_running`` 0: a forwarding model such
# as ``_sync`` legitimately waits for the engine) -- all for this long. Seen with Triton 2.51's
# Python backend after a stub missed its 1-s health deadline: the backend takes the stub's
# late reply as the answer to the next request and, instead of crashing, can stop executing
# that model for good (the last CI run: every later request timed out). ``failure()`` reports
# it so that ``serve`` starts the server again.
WEDGE_SECONDS = 30.0
_WAIT4 = {"x86_64": 61, "aarch64": 260}.get(platform.machine())  # Linux syscall numbers
_STUB_BINARY = b"triton_python_backend_stub"
_STUB_NAME_ARG = 8  # argv: stub, model.py, shm region, sizes x2, parent pid, lib dir, ipc handle, NAME


# A Python-backend stub that died while its server runs (a crash, the kernel's OOM killer):
# Triton 2.51 restarts a dead stub only for a non-decoupled model, and only once a request
# finds it; it never reaps one of a decoupled model (the engine, postprocessing), which stays a
# zombie child of tritonserver while every later request of that model fails "Stub process
# '<instance>' is not healthy" (seen in CI: the C++ path's engine stand-in, five tests in a
# row). ``failure()`` reports a stub that has been a zombie this long (a stub that Triton
# itself ends, at an unload, is reaped at once), so that ``serve`` starts the server again.
DEAD_STUB_SECONDS = 2.0


def _stub_name(pid: int) -> str | None:
    """The instance name of a running Python-backend stub (from its argv), else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) > _STUB_NAME_ARG and argv[0].endswith(_STUB_BINARY):
        return argv[_STUB_NAME_ARG].decode("utf-8", "replace")
    return None


def stub_children(server_pid: int) -> dict[int, tuple[str | None, str, int]]:
    """The Python-backend stubs among ``server_pid``'s children: pid -> (instance name, or
    None once it has exited; state letter from /proc; its exit status as waitpid() gives it,
    meaningful for a zombie ('Z'))."""
    found: dict[int, tuple[str | None, str, int]] = {}
    try:
        tasks = list(Path(f"/proc/{server_pid}/task").iterdir())
    except OSError:
        return found
    children: set[int] = set()
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            children.update(int(c) for c in (task / "children").read_text().split())
    for child in children:
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if not _STUB_BINARY.decode().startswith(comm):  # comm holds the first 15 characters
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is field 3 (state); field 52 (exit_code) is fields[49]
        code = int(fields[49]) if len(fields) > 49 else 0
        found[child] = (_stub_name(child), fields[0], code)
    return found


def _exit_how(status: int) -> str:
    """A waitpid() status in words."""
    if status & 0x7F:
        sig = status & 0x7F
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit code {status >> 8}"


def stubs_waited_on(server_pid: int) -> dict[int, str]:
    """Python-backend stubs (pid -> instance name) that a thread of ``server_pid`` is
    blocked in wait4() on, read from /proc (empty where /proc does not say)."""
    found: dict[int, str] = {}
    if _WAIT4 is None:
        return found
    try:
        tasks = list(Path(f"/proc/{server_pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            fields = (task / "syscall").read_text().split()
            if len(fields) < 2 or fields[0] != str(_WAIT4):
                continue
            child = int(fields[1], 16)
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0") if child > 0 else []
        except (OSError, ValueError):
            continue
        if len(argv) > _STUB_NAME_ARG and argv[0].endswith(_STUB_BINARY):
            found[child] = argv[_STUB_NAME_ARG].decode("utf-8", "replace")
    return found


class StartStalled(Exception):
    """tritonserver stopped making progress while loading (see ``STALL_SECONDS``)."""


class ServerError(Exception):
    """The server could not be laid out, started, or did not become ready."""


@dataclass(frozen=True)
class ServerInstall:
    binary: Path
    backend_dir: Path
    cache_dir: Path | None
    lib_dirs: tuple[Path, ...]
    bundled: bool


def _pytriton_root() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_install(*, prefer_path: bool = True) -> ServerInstall:
    """Find a tritonserver: one on PATH (NGC image) first, else the pytriton-bundled one."""
    on_path = shutil.which("tritonserver") if prefer_path else None
    if on_path:
        binary = Path(on_path).resolve()
        root = binary.parent.parent  # /opt/tritonserver/bin/tritonserver
        caches = root / "caches"
        return ServerInstall(binary, root / "backends", caches if caches.is_dir() else None, (), False)
    pkg = _pytriton_root()
    if pkg is None:
        raise ServerError(
            "no tritonserver found: none on PATH and nvidia-pytriton is not installed "
            "(run scripts/setup.sh, or pip install nvidia-pytriton==0.7.0)"
        )
    src = pkg / "tritonserver"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = src / "python_backend_stubs" / py / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no Python backend stub for Python {py} ({stub})")
    libs = pkg.parent / "nvidia_pytriton.libs"
    dest = cache_dir() / "tritonserver" / f"pytriton-{_dist_version('nvidia-pytriton')}-py{py}"
    if not (dest / ".complete").is_file():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns("python_backend_stubs"))
        shutil.copy2(stub, tmp / "backends" / "python" / "triton_python_backend_stub")
        (tmp / ".complete").write_text("ok\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    libdir = sysconfig.get_config_var("LIBDIR")
    lib_dirs = tuple(p for p in (Path(libdir) if libdir else None, libs) if p is not None)
    return ServerInstall(dest / "bin" / "tritonserver", dest / "backends", dest / "caches", lib_dirs, True)


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def server_environment(install: ServerInstall, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the server (and so every Python backend stub) runs in."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    if install.lib_dirs:
        parts = [str(p) for p in install.lib_dirs]
        if env.get("LD_LIBRARY_PATH"):
            parts.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(parts)
    cache = cache_dir()
    tmp = cache / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.setdefault("TRITONFORGE_CACHE", str(cache))
    env["TMPDIR"] = str(tmp)  # vLLM leaves IPC sockets in TMPDIR
    env.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # vLLM's CPU backend pins each engine's worker threads to core 0 by default; several
    # engines on one small machine (tests, a benchmark beside a server) then share a single
    # core and start in minutes instead of seconds. Let the OS place the threads.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if extra:
        env.update(extra)
    return env


_GIVEN: set[int] = set()  # ports free_port() returned in this process


def _ephemeral_low() -> int:
    """The lowest port the OS hands out for ``bind(0)`` and outgoing connections (Linux's
    ip_local_port_range; its usual default elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, chosen below the OS's ephemeral range. A port from ``bind(0)`` is
    free only until the OS hands it out again, to any socket bound that way or any outgoing
    connection (vLLM's engine opens sockets while tritonserver loads it, before Triton's HTTP
    service binds): measured here once as "Socket ... already in use" for a port picked so."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        if port in _GIVEN:  # two servers of one process must not get the same port
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServerOptions:
    repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_file: Path | None = None
    restrict_admin: bool = True
    admin_key: str | None = None  # default: $TRITONFORGE_ADMIN_KEY, else a random key
    response_cache_bytes: int = 0
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    front: bool = False  # serve HTTP through runtime.front (see the module's docstring)

    def endpoint(self, port: int) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{host}:{port}"

    @property
    def http_url(self) -> str:
        return self.endpoint(self.http_port)

    @property
    def grpc_url(self) -> str:
        return self.endpoint(self.grpc_port)

    @property
    def metrics_url(self) -> str:
        return self.endpoint(self.metrics_port)


class TritonServer:
    """One tritonserver process (and its process group)."""

    def __init__(self, options: ServerOptions, install: ServerInstall | None = None) -> None:
        self.options = options
        self.install = install or find_install()
        self.process: subprocess.Popen[bytes] | None = None
        self._log_handle: object | None = None
        key = options.admin_key or os.environ.get(RESTRICTED_API_KEY_ENV)
        if key is None and options.restrict_admin:
            key = os.urandom(16).hex()
        self.admin_key = key
        self._published: list[Path] = []
        self._log_start = 0
        self.restarts_after_crash = 0  # starts retried by start_ready()
        self.drain_file = cache_dir() / "run" / f"drain-{options.http_port}-{os.getpid()}-{id(self):x}"
        self.restart_file = self.drain_file.with_name(self.drain_file.name.replace("drain-", "restart-", 1))
        self._progress: dict[str, tuple[float, float]] = {}  # model -> (exec count, since) (wedged())
        self._stub_names: dict[int, str] = {}  # stub pid -> instance name, seen while it ran
        self._zombies: dict[int, float] = {}  # stub pid -> first seen dead (dead_stub())
        self.front: subprocess.Popen[bytes] | None = None
        self.cancel_dir = self.drain_file.with_name(self.drain_file.name.replace("drain-", "cancel-", 1))
        # tritonserver's own HTTP port: the public one, or a private one behind the front.
        self.triton_http_port = options.http_port

    @property
    def log_file(self) -> Path:
        if self.options.log_file is not None:
            return self.options.log_file
        return cache_dir() / "logs" / f"tritonserver-{self.options.http_port}.log"

    def command(self) -> list[str]:
        o = self.options
        cmd = [
            str(self.install.binary),
            f"--model-repository={o.repository}",
            f"--backend-directory={self.install.backend_dir}",
            f"--http-address={'127.0.0.1' if o.front else o.host}",
            f"--http-port={self.triton_http_port}",
            f"--grpc-address={o.host}",
            f"--grpc-port={o.grpc_port}",
            f"--metrics-address={o.host}",
            f"--metrics-port={o.metrics_port}",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            f"--exit-timeout-secs={EXIT_TIMEOUT_SECONDS}",
            # The Python backend gives a stub 30 s by default to answer its start-up; past
            # that it waits forever for the stub to exit, and the model never loads. A busy
            # 2-core machine importing torch in several stubs at once takes longer.
            f"--backend-config=python,stub-timeout-seconds={STUB_TIMEOUT_SECONDS}",
            f"--log-verbose={o.log_verbose}",
        ]
        if o.front:  # the front's key of an /infer call reaches the model as a request parameter
            cmd.append(f"--http-header-forward-pattern=^{FRONT_KEY_PARAMETER}$")
        if self.install.cache_dir is not None:
            cmd.append(f"--cache-directory={self.install.cache_dir}")
        if o.response_cache_bytes > 0:
            cmd.append(f"--cache-config=local,size={o.response_cache_bytes}")
        if o.restrict_admin and self.admin_key:
            groups = ",".join(RESTRICTED_GROUPS)
            cmd.append(f"--http-restricted-api={groups}:{RESTRICTED_HEADER}={self.admin_key}")
            cmd.append(f"--grpc-restricted-protocol={groups}:{RESTRICTED_HEADER}={self.admin_key}")
        cmd.extend(o.extra_args)
        return cmd

    def start(self) -> None:
        if self.process is not None:
            raise ServerError("server already started")
        for port in (self.options.http_port, self.options.grpc_port, self.options.metrics_port):
            if _port_in_use(self.options.host, port):
                raise ServerError(
                    f"port {port} on {self.options.host} is already in use; pick another with "
                    "--http-port/--grpc-port/--metrics-port or stop what uses it"
                )
        self._progress = {}
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        self._log_handle = log
        env = server_environment(self.install, self.options.env)
        self.drain_file.parent.mkdir(parents=True, exist_ok=True)
        self.drain_file.unlink(missing_ok=True)
        self.restart_file.unlink(missing_ok=True)
        env[DRAIN_FILE_ENV] = str(self.drain_file)
        env[RESTART_FILE_ENV] = str(self.restart_file)
        if self.options.front:
            self.triton_http_port = free_port("127.0.0.1")
            shutil.rmtree(self.cancel_dir, ignore_errors=True)
            self.cancel_dir.mkdir(parents=True)
            env[CANCEL_DIR_ENV] = str(self.cancel_dir)
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        if self.options.front:
            # A session of its own too: a Ctrl-C in the terminal must not cut the streams it
            # relays while the server drains; it leaves by itself if this process dies.
            self.front = subprocess.Popen(
                [sys.executable, "-m", "tritonforge.runtime.front", "--host", self.options.host,
                 "--port", str(self.options.http_port), "--upstream", f"127.0.0.1:{self.triton_http_port}",
                 "--cancel-dir", str(self.cancel_dir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        if self.options.restrict_admin and self.admin_key:
            # Local commands (complete, chat, loadtest, gateway) learn the key from here.
            self._published = adminkey.publish(
                self.admin_key, (self.options.http_port, self.options.grpc_port))

    def is_ready(self) -> bool:
        """Ready, and its metrics endpoint answers (Triton starts it just after HTTP)."""
        try:
            with urllib.request.urlopen(
                f"http://{self.options.http_url}/v2/health/ready", timeout=2
            ) as r:
                if r.status != 200:
                    return False
            with urllib.request.urlopen(f"http://{self.options.metrics_url}/metrics", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 300.0, on_tick: Callable[[float], None] | None = None,
                   stall_seconds: float | None = None) -> float:
        """Block until ready; return seconds waited. Raises ServerError with the log tail
        (``StartStalled`` first when ``stall_seconds`` pass without the log growing)."""
        start = time.monotonic()
        size, grew = -1, start
        waited_on: dict[int, float] = {}  # stub pid -> first seen waited on (see STUB_WAIT_SECONDS)
        checked = 0.0
        while True:
            now = time.monotonic()
            elapsed = now - start
            if stall_seconds is not None:
                with contextlib.suppress(OSError):
                    current = self.log_file.stat().st_size
                    if current != size:
                        size, grew = current, now
                if now - grew > stall_seconds and not self.is_ready():
                    raise StartStalled(f"tritonserver made no progress for {stall_seconds:.0f} s "
                                       f"while loading.\n{self.log_tail()}")
                if self.process is not None and now - checked >= 1.0:
                    checked = now
                    stubs = stubs_waited_on(self.process.pid)
                    waited_on = {pid: waited_on.get(pid, now) for pid in stubs}
                    stuck = [pid for pid, since in waited_on.items() if now - since >= STUB_WAIT_SECONDS]
                    if stuck and not self.is_ready():
                        raise StartStalled(
                            f"the Python backend declared stub {stubs[stuck[0]]!r} unhealthy while it "
                            f"started and has waited {STUB_WAIT_SECONDS:.0f} s for it to exit (it never "
                            f"will: Triton 2.51 does not tell it to).\n{self.log_tail()}")
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise ServerError(f"tritonserver exited (code {code}) before it was ready.\n{self.log_tail()}")
            if self.is_ready():
                return elapsed
            if elapsed > timeout:
                raise ServerError(f"tritonserver not ready after {timeout:.0f} s.\n{self.log_tail()}")
            if on_tick:
                on_tick(elapsed)
            time.sleep(0.25)

    def start_ready(self, timeout: float = 600.0, on_tick: Callable[[float], None] | None = None,
                    retries: int = 2, stall_seconds: float = STALL_SECONDS) -> float:
        """``start()`` then ``wait_ready()``; when tritonserver aborts while loading with one
        of :data:`KNOWN_START_CRASHES`, or its start stalls (:data:`STALL_SECONDS`), and
        only then, stop and start again, at most ``retries`` times. Returns the seconds the
        successful start waited."""
        for attempt in range(retries + 1):
            self.start()
            try:
                return self.wait_ready(timeout, on_tick, stall_seconds=stall_seconds)
            except StartStalled as exc:
                self.stop(timeout=5)  # nothing to drain: it never served
                if attempt == retries:
                    raise ServerError(str(exc)) from None
                self.restarts_after_crash += 1
            except ServerError:
                crashed = self.process is not None and self.process.poll() is not None and any(
                    sig in self._log_since_start() for sig in KNOWN_START_CRASHES)
                self.stop()
                if not crashed or attempt == retries:
                    raise
                self.restarts_after_crash += 1
        raise AssertionError("unreachable")

    def _log_since_start(self) -> str:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(self._log_start)
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _metrics_text(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://{self.options.metrics_url}/metrics", timeout=2) as r:
                return str(r.read().decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError):
            return None

    def engines_up(self, text: str | None = None) -> bool | None:
        """False when an engine model reports its engine dead (``tritonforge_engine_up`` 0 on
        the metrics endpoint); None when that cannot be read."""
        text = self._metrics_text() if text is None else text
        if text is None:
            return None
        return all(v > 0 for v in _series(text, ENGINE_UP).values())

    def wedged(self, text: str | None = None, now: float | None = None) -> str | None:
        """Which model is wedged (see ``WEDGE_SECONDS``), as a sentence; None when none is
        (or the metrics cannot be read). Call it regularly: it compares with earlier calls."""
        text = self._metrics_text() if text is None else text
        if text is None:
            return None
        now = time.monotonic() if now is None else now
        pending = _series(text, "nv_inference_pending_request_count")
        executed = _series(text, "nv_inference_exec_count")
        busy = sum(_series(text, REQUESTS_RUNNING).values()) > 0
        for model, waiting in pending.items():
            count = executed.get(model, 0.0)
            last = self._progress.get(model)
            if waiting <= 0 or busy or last is None or last[0] != count:
                self._progress[model] = (count, now)
                continue
            if now - last[1] >= WEDGE_SECONDS:
                return (f"model {model!r} has {waiting:.0f} request(s) waiting and has executed none "
                        f"for {now - last[1]:.0f} s while the engine is idle")
        return None

    def dead_stub(self, now: float | None = None) -> str | None:
        """Which Python-backend stub has died under the running server (see
        ``DEAD_STUB_SECONDS``), as a sentence; None when none has. Call it regularly: the
        instance names are learnt while the stubs run."""
        if self.process is None or self.process.poll() is not None:
            return None
        now = time.monotonic() if now is None else now
        stubs = stub_children(self.process.pid)
        dead = {}
        for pid, (name, state, code) in stubs.items():
            if name is not None:
                self._stub_names[pid] = name
            if state in ("Z", "X"):
                dead[pid] = code
        self._zombies = {pid: self._zombies.get(pid, now) for pid in dead}
        for pid, since in self._zombies.items():
            if now - since >= DEAD_STUB_SECONDS:
                name = self._stub_names.get(pid)
                which = f"of model instance {name!r}" if name else "of a model"
                return (f"the Python-backend stub {which} (pid {pid}) died ({_exit_how(dead[pid])}); "
                        "Triton 2.51 does not restart it, and every request of that model now fails")
        return None

    def failure(self, deep: bool = True) -> tuple[str | None, str]:
        """Why the running server needs a restart (None: it does not): tritonserver exited,
        a model asked for it (the restart file, ``contract.RESTART_FILE_ENV``), a
        Python-backend stub died, an engine died, or a model is wedged; and the log's tail when tritonserver is gone.
        ``deep`` False: only the first two (no /proc walk, no metrics scrape -- which cost
        tritonserver and this process CPU the model's threads would otherwise have)."""
        proc = self.process
        if self.front is not None and proc is not None and proc.poll() is None and self.front.poll() is not None:
            return f"the HTTP front exited unexpectedly (exit code {self.front.returncode})", self.log_tail(15)
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            if code is not None and code < 0:
                try:
                    how = f"killed by {signal.Signals(-code).name}"
                except ValueError:
                    how = f"killed by signal {-code}"
            else:
                how = f"exit code {code}"
            return f"tritonserver exited unexpectedly ({how})", self.log_tail(15)
        with contextlib.suppress(OSError):
            asked = self.restart_file.read_text().strip()
            if asked:
                return asked, ""
        if not deep:
            return None, ""
        if (dead := self.dead_stub()) is not None:
            return dead, self.log_tail(15)
        text = self._metrics_text()
        if text is None:
            return None, ""
        if self.engines_up(text) is False:
            # Triton 2.51 cannot mark a Python model not ready: restart the server. Its health
            # endpoint fails from the stop on, and clients see ServerUnavailable.
            return "the inference engine died", ""
        why = self.wedged(text)
        if why is not None:
            return why, self.log_tail(15)
        return None, ""

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def drain(self) -> None:
        """Ask the engine models to end every live request and refuse new ones."""
        self.drain_file.parent.mkdir(parents=True, exist_ok=True)
        self.drain_file.write_text("draining\n")

    def stop(self, timeout: float = 30.0) -> int | None:
        """Drain, SIGTERM the process group, then SIGKILL what is left; return the exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                self.drain()
                time.sleep(DRAIN_SECONDS)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # Stubs and engine workers share the group; make sure none outlives the server.
        _signal_group(proc.pid, signal.SIGKILL)
        self._stop_front()
        self.drain_file.unlink(missing_ok=True)
        self.restart_file.unlink(missing_ok=True)
        if self.admin_key:
            adminkey.withdraw(self.admin_key, self._published)
        self._published = []
        if self._log_handle is not None:
            with contextlib.suppress(Exception):
                self._log_handle.close()  # type: ignore[attr-defined]
        self.process = None
        return proc.returncode

    def _stop_front(self) -> None:
        """After tritonserver: the streams it ended have reached their clients through it."""
        front, self.front = self.front, None
        if front is not None and front.poll() is None:
            front.terminate()
            try:
                front.wait(10)
            except subprocess.TimeoutExpired:
                front.kill()
                front.wait(5)
        shutil.rmtree(self.cancel_dir, ignore_errors=True)

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _series(text: str, name: str) -> dict[str, float]:
    """Values of one metric in Prometheus text, summed per ``model`` label ("" without one)."""
    out: dict[str, float] = {}
    prefix = name + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix):].rpartition("} ")
        start = labels.find('model="')
        model = labels[start + 7:labels.index('"', start + 7)] if start >= 0 else ""
        try:
            out[model] = out.get(model, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def running(options: ServerOptions, timeout: float = 300.0) -> Iterator[TritonServer]:
    server = TritonServer(options)
    server.start()
    try:
        server.wait_ready(timeout)
        yield server
    finally:
        server.stop()
