"""A known intermittent abort of Triton's Python backend at start-up is retried, nothing else.

Triton 2.51's Python backend sometimes aborts while models load on a loaded machine
(``boost::interprocess::lock_exception``; upstream server#8882), or loses a stub's start-up
handshake and waits forever (a silent log). ``TritonServer.start_ready`` (what ``serve`` and
the test fixtures use) starts again on those only. The crash
cannot be provoked on demand, so the first start here runs a wrapper in place of the
binary that prints the abort's message and exits as an abort does (a stand-in for that one
failed start, and only that); the next start execs the real bundled tritonserver, on an
empty repository, and must become ready. A start failing any other way is not retried.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tritonforge.runtime.server import ServerError, ServerOptions, TritonServer, find_install, free_port


def _wrapper(tmp: Path, first_run: str) -> tuple[Path, Path]:
    real = find_install().binary
    count = tmp / "starts"
    script = tmp / "tritonserver"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo x >> "{count}"\n'
        f'if [ "$(wc -l < "{count}")" -eq 1 ]; then\n{first_run}\nfi\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return script, count


def _server(tmp: Path, binary: Path) -> TritonServer:
    repo = tmp / "empty-repo"
    repo.mkdir()
    install = dataclasses.replace(find_install(), binary=binary)
    opts = ServerOptions(repository=repo, http_port=free_port(), grpc_port=free_port(),
                         metrics_port=free_port(), restrict_admin=False, log_file=tmp / "server.log")
    return TritonServer(opts, install=install)


def test_the_known_python_backend_abort_is_retried(tmp_path: Path) -> None:
    script, count = _wrapper(tmp_path, (
        "  echo \"terminate called after throwing an instance of 'boost::interprocess::lock_exception'\"\n"
        "  echo '  what():  boost::interprocess::lock_exception'\n"
        "  exit 134"))
    server = _server(tmp_path, script)
    try:
        server.start_ready(timeout=120)
        assert server.is_ready()
        assert server.restarts_after_crash == 1
        assert len(count.read_text().splitlines()) == 2
    finally:
        server.stop()


def test_a_start_that_stalls_is_retried(tmp_path: Path) -> None:
    # The first start says nothing and never becomes ready (a stand-in for the backend's
    # lost stub handshake, which cannot be provoked on demand).
    script, count = _wrapper(tmp_path, "  exec sleep 120")
    server = _server(tmp_path, script)
    try:
        server.start_ready(timeout=120, stall_seconds=3)
        assert server.is_ready()
        assert server.restarts_after_crash == 1
        assert len(count.read_text().splitlines()) == 2
    finally:
        server.stop()


def test_other_start_failures_are_not_retried(tmp_path: Path) -> None:
    script, count = _wrapper(tmp_path, "  echo 'error: something else went wrong'\n  exit 1")
    server = _server(tmp_path, script)
    try:
        with pytest.raises(ServerError, match="something else went wrong"):
            server.start_ready(timeout=120)
        assert server.restarts_after_crash == 0
        assert len(count.read_text().splitlines()) == 1
    finally:
        server.stop()
