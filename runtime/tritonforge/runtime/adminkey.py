"""The admin key of a local server, handed to local commands through a user-only file.

``serve`` restricts Triton's admin APIs (the model-repository index among them) to requests
that carry the header ``admin-key: KEY``; the key is random unless
``$TRITONFORGE_ADMIN_KEY`` chooses it. So that ``tritonforge complete``, ``chat``,
``loadtest`` and ``gateway`` on the same machine can discover the served model without the
user copying the key, the server publishes it while it runs in one file per listening port,
``<cache>/run/admin-key-<port>``, in a folder only the user can enter (0700) and a file only
the user can read (0600). A client reads it only for a loopback URL, only when the file is
the user's own and not readable by anyone else. Nothing changes for other callers: Triton
refuses every request without the key, whatever its address; this file only decides who can
learn the key, and that is whoever can read the user's files.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from tritonforge.runtime.paths import cache_dir

__all__ = ["ENV", "key_file", "local_key", "publish", "withdraw"]

ENV = "TRITONFORGE_ADMIN_KEY"
_PREFIX = "admin-key-"


def _run_dir() -> Path:
    path = cache_dir() / "run"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def key_file(port: int) -> Path:
    return _run_dir() / f"{_PREFIX}{port}"


def publish(key: str, ports: Iterable[int]) -> list[Path]:
    """Write ``key`` for each port (atomically, mode 0600); return the files written."""
    written = []
    for port in ports:
        path = key_file(port)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        os.replace(tmp, path)
        written.append(path)
    return written


def withdraw(key: str, paths: Iterable[Path]) -> None:
    """Remove the files ``publish`` wrote, unless another server has replaced them since."""
    for path in paths:
        with contextlib.suppress(OSError):
            if path.read_text() == key:
                path.unlink()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    return False


def _host_port(url: str) -> tuple[str, int] | None:
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host, int(port)


def local_key(url: str) -> str | None:
    """``$TRITONFORGE_ADMIN_KEY``, else the key a server on this machine published for the
    port of ``url`` (loopback URLs only), else None."""
    env = os.environ.get(ENV)
    if env:
        return env
    parsed = _host_port(url)
    if parsed is None or not _loopback(parsed[0]):
        return None
    path = cache_dir() / "run" / f"{_PREFIX}{parsed[1]}"
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return None
        return path.read_text().strip() or None
    except OSError:
        return None
