"""`tritonforge doctor`: every environment check on this machine (passing and failing for
real reasons), and every `--explain` pattern on the error text it was written for."""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from tritonforge.runtime import doctor as D
from tritonforge.runtime.server import find_install, free_port, server_environment
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]

# The error texts as the software prints them (trimmed to the telling line).
SAMPLES: dict[str, str] = {
    "cuda-oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB "
                "total capacity; 21.10 GiB already allocated)",
    "kv-cache-too-small": "ValueError: To serve at least one request with the models's max seq len (32768), "
                          "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
                          "(1.20 GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
    "cpu-kv-cache": "ValueError: Available memory on node 0 (0.5/23.4 GiB) on kv cache allocation is less than "
                    "requested memory for kv (64.0 GiB). Decrease --kv-cache-memory-bytes, "
                    "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
    "cpu-oom": "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc",
    "tokenizer-mismatch": "ValueError: Token id 151643 is out of vocabulary",
    "connection-refused": "tritonclient.utils.InferenceServerException: [StatusCode.UNAVAILABLE] failed to "
                          "connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8001: "
                          "Failed to connect to remote host: Connection refused",
    "decoupled-modelinfer": "[StatusCode.UNIMPLEMENTED] ModelInfer RPC doesn't support models with decoupled "
                            "transaction policy",
    "decoupled-generate": '{"error":"generate expects model to produce exactly 1 response, use generate '
                          'stream for model that generates various number of responses"}',
    "wrong-request-format": "[StatusCode.INVALID_ARGUMENT] [request id: <id_unknown>] expected 1 inputs but "
                            "got 2 inputs for model 'preprocessing'",
    "libpython-mismatch": "ImportError: /root/.venv/lib/python3.11/lib-dynload/_ctypes.so: undefined symbol: "
                          "_PyModule_Add",
    "numpy2": "struct.error: unpack_from requires a buffer of at least 202116112 bytes for unpacking 4 bytes at "
              "offset 202116108 (actual buffer size is 12)",
    "quantization-unsupported": "ValueError: awq quantization is currently not supported in cpu.",
    "ascii-locale": "UnicodeDecodeError: 'ascii' codec can't decode byte 0xe2 in position 2047: ordinal not in "
                    "range(128)",
    "stub-no-numpy": "ModuleNotFoundError: No module named 'numpy'",
    "torchvision-cuda": "RuntimeError: operator torchvision::nms does not exist",
    "address-in-use": "E1130 grpc_server.cc] Failed to start GRPC service: Address already in use",
    "restricted-api": '{"error":"This API is restricted, expecting header \'admin-key\'"}',
}
# More phrasings of the same problems (other versions, other transports).
MORE: list[tuple[str, str]] = [
    ("cuda-oom", "RuntimeError: CUDA error: out of memory"),
    ("kv-cache-too-small", ("ValueError: No available memory for the cache blocks. Try increasing "
                           "`gpu_memory_utilization` when initializing the engine.")),
    ("wrong-request-format", ("inference input 'max_tokens' data-type is 'FP32', but model 'ensemble' expects "
                             "'INT32'")),
    ("wrong-request-format", ("unexpected shape for input 'text_input' for model 'ensemble'. Expected [-1,1], "
                             "got [1,2].")),
    ("wrong-request-format", ("unexpected datatype TYPE_FP32 for inference input 'max_tokens', expecting "
                             "TYPE_INT32")),
    ("numpy2", "A module that was compiled using NumPy 1.x cannot be run in\nNumPy 2.0.0 as it may crash."),
    ("quantization-unsupported", ("ValueError: The quantization method fp8 is not supported for the current "
                                 "GPU. Minimum capability: 89. Current capability: 80.")),
    ("quantization-unsupported", "ValueError: Unknown quantization method: foo. Must be one of ['awq', ...]"),
    ("connection-refused", "httpx.ConnectError: [Errno 111] Connection refused"),
    ("tokenizer-mismatch", "IndexError: index out of range in self"),
]


def _cli(*args: str) -> Any:
    from tritonforge.cli import _register_all, app

    _register_all()
    return CliRunner().invoke(app, ["doctor", *args])


# ------------------------------------------------------------------------------ explain
def test_every_pattern_has_a_sample_and_nothing_else_matches_it() -> None:
    assert {p.diagnosis.key for p in D.PATTERNS} == set(SAMPLES)
    for key, text in SAMPLES.items():
        keys = [d.key for d in D.explain(text)]
        assert keys and keys[0] == key or key in keys, (key, keys)


@pytest.mark.parametrize(("key", "text"), list(SAMPLES.items()) + MORE,
                         ids=[k for k in SAMPLES] + [f"{k}-{i}" for i, (k, _) in enumerate(MORE)])
def test_explain_maps_the_error_to_a_diagnosis_and_fix(key: str, text: str) -> None:
    found = {d.key: d for d in D.explain(text)}
    assert key in found, (key, list(found))
    assert found[key].fix and found[key].cause


def test_explain_cli_on_text_and_on_a_log_file(tmp_path: Path) -> None:
    result = _cli("--explain", SAMPLES["ascii-locale"])
    assert result.exit_code == 0, result.output
    assert "ASCII locale" in result.stdout and "C.UTF-8" in result.stdout
    log = tmp_path / "server.log"
    log.write_text("I1130 loading: vllm_engine:1\n" + SAMPLES["cpu-kv-cache"] + "\nW1130 unrelated\n"
                   + SAMPLES["libpython-mismatch"] + "\n")
    result = _cli("--explain", str(log))
    assert result.exit_code == 0, result.output
    assert "CPU KV cache" in result.stdout and "VLLM_CPU_KVCACHE_SPACE" in result.stdout
    assert "Python version/build mismatch" in result.stdout and str(log.name) in result.stdout


def test_explain_cli_unknown_text_exits_1_without_traceback() -> None:
    result = _cli("--explain", "everything is fine")
    assert result.exit_code == 1
    assert "no known deployment error" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------ checks
def test_checks_pass_on_this_machine() -> None:
    for check in (D.check_server_binary(), D.check_backend_stub(), D.check_libpython(), D.check_locale(),
                  D.check_numpy(), D.check_model_files(ROOT / "model_repository")):
        assert check.status is D.Status.OK, check
    assert "libtriton_python" not in D.check_server_binary().detail  # names the binary
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in D.check_backend_stub().detail


def test_engine_import_ok_here_and_fails_in_a_python_without_vllm(tmp_path: Path) -> None:
    ok = D.check_engine_import(timeout=600)
    assert ok.status is D.Status.OK and ok.detail.startswith("vllm "), ok
    # A real interpreter that has no vLLM: a fresh venv without site-packages.
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    bad = D.check_engine_import(python=str(tmp_path / "bare" / "bin" / "python"), timeout=120)
    assert bad.status is D.Status.FAIL
    assert "No module named 'vllm'" in bad.detail and bad.fix


def test_libpython_mismatch_is_caught_without_the_interpreter_libdir() -> None:
    """Without the interpreter's LIBDIR first on LD_LIBRARY_PATH the stub loads another
    libpython on this machine (the RUNTIME trap); the check must say so."""
    install = find_install()
    env = server_environment(install)
    libdir = sysconfig.get_config_var("LIBDIR")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != libdir
    )
    check = D.check_libpython(env)
    own = Path(libdir) / (sysconfig.get_config_var("INSTSONAME") or "")
    linked = D._linked_libpython(install.backend_dir / "python" / "triton_python_backend_stub", env)
    if linked is not None and linked != "not" and Path(linked).resolve() == own.resolve():
        pytest.fail("this machine's stub loads the interpreter's libpython even without LIBDIR; "
                    "the mismatch case cannot be shown here")
    assert check.status is D.Status.FAIL, check
    assert "_PyModule_Add" in check.detail and str(libdir) in check.fix


def test_numpy_2_fails() -> None:
    check = D.check_numpy("2.4.6")
    assert check.status is D.Status.FAIL and "numpy<2" in check.fix
    assert D.check_numpy("1.26.4").status is D.Status.OK


def test_model_files_unknown_and_unprepared(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'parameters { key: "tritonforge_model" value { string_value: "package:no-such-model" } }\n')
    check = D.check_model_files(repo)
    assert check.status is D.Status.FAIL and "unknown packaged model" in check.detail
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    (repo / "m" / "config.pbtxt").write_text(
        f'parameters {{ key: "tritonforge_model" value {{ string_value: "{gguf}" }} }}\n')
    check = D.check_model_files(repo)
    assert check.status is D.Status.WARN and "not prepared yet" in check.detail


def test_ports_busy_and_free() -> None:
    free = free_port()
    assert D.check_ports("127.0.0.1", [free]).status is D.Status.OK
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        check = D.check_ports("127.0.0.1", [free, busy])
        assert check.status is D.Status.FAIL and str(busy) in check.detail
        assert [a for a, _ in D.listeners(busy)] == ["127.0.0.1"]


def test_server_url_unreachable_fails() -> None:
    check = D.check_server_url(f"127.0.0.1:{free_port()}", timeout=2)
    assert check.status is D.Status.FAIL and "cannot reach" in check.detail


@pytest.mark.server
def test_server_url_reachable(triton_server: Any) -> None:
    check = D.check_server_url(triton_server.http_url)
    assert check.status is D.Status.OK, check


def test_cli_table_and_exit_codes(tmp_path: Path) -> None:
    result = _cli("--no-engine", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                  "--metrics-port", str(free_port()))
    assert result.exit_code == 0, result.output
    for name in ("server binary", "Python backend stub", "libpython match", "stub locale", "numpy < 2",
                 "model files", "ports free"):
        assert name in result.stdout
    assert "0 fail" in result.stdout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = str(s.getsockname()[1])
        result = _cli("--no-engine", "--http-port", busy)
    assert result.exit_code == 1, result.output
    assert "fail" in result.stdout and busy in result.stdout and "Traceback" not in result.output
    result = _cli("--no-engine", "--url", f"127.0.0.1:{free_port()}")
    assert result.exit_code == 1 and "cannot reach" in result.stdout
    result = _cli("--no-engine", "--repo", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "not a folder" in result.output
