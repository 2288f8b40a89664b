"""tcmalloc in vLLM's CPU engine processes (``runtime.preload``), read from the kernel's
memory maps of the shared server's real processes, not from tritonforge's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import descendants
from tritonforge.runtime import doctor
from tritonforge.runtime.preload import tcmalloc_path, with_tcmalloc

pytestmark = pytest.mark.server


def _mapped(pid: int) -> tuple[str, bool]:
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return comm, "libtcmalloc" in Path(f"/proc/{pid}/maps").read_text()


def test_vllms_engine_processes_and_only_they_run_on_tcmalloc(triton_server: Any) -> None:
    lib = tcmalloc_path()
    assert lib is not None, "scripts/setup.sh installs libtcmalloc-minimal4 (as root, with apt)"
    procs = [_mapped(p) for p in (triton_server.server.process.pid, *descendants(triton_server.server.process.pid))]
    engine = [m for c, m in procs if c.startswith("VLLM::")]
    assert engine and all(engine), procs  # EngineCore and its worker
    assert not any(m for c, m in procs if c in ("tritonserver", "triton_python_b")), procs
    assert doctor.check_allocator().status is doctor.Status.OK


def test_the_preload_is_added_once_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tcmalloc_path()
    assert lib is not None
    assert with_tcmalloc("") == lib
    assert with_tcmalloc("/x/libother.so") == f"{lib}:/x/libother.so"
    assert with_tcmalloc(with_tcmalloc("")) == lib
    monkeypatch.setenv("TRITONFORGE_NO_PRELOAD", "1")
    assert with_tcmalloc("") == ""
    assert doctor.check_allocator().status is doctor.Status.WARN
