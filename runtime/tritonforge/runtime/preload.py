"""The CPU memory allocator vLLM's CPU engine asks for: tcmalloc, preloaded into its processes.

vLLM's CPU worker warns at start that ``libtcmalloc`` is not in ``LD_PRELOAD`` "for best
performance". Measured here (bench_peer's client, 64 forced tokens, 3 server visits each, ABBA
order): 8 streams gave 165 tok/s with tcmalloc preloaded into vLLM's engine processes against
152 without (medians). ``scripts/setup.sh`` installs Debian's ``libtcmalloc-minimal4`` where
it can (root with apt); tritonforge's vLLM engine model, on a CPU, puts the library in
``LD_PRELOAD`` before it imports vLLM, so the engine core and worker processes vLLM spawns
load it (tritonserver and the Python stubs keep the system allocator). ``tritonforge doctor``
says whether it was found. ``TRITONFORGE_NO_PRELOAD=1`` turns it off.
"""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

__all__ = ["NO_PRELOAD_ENV", "TCMALLOC_PACKAGE", "tcmalloc_path", "with_tcmalloc"]

NO_PRELOAD_ENV = "TRITONFORGE_NO_PRELOAD"
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"  # Debian/Ubuntu
_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
         "/usr/local/lib")


def tcmalloc_path() -> str | None:
    """Where tcmalloc is on this machine (None: not installed)."""
    for d in _DIRS:
        for name in _NAMES:
            if (Path(d) / name).is_file():
                return str(Path(d) / name)
    found = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return found if found and Path(found).is_absolute() else None


def with_tcmalloc(preload: str) -> str:
    """``preload`` (an ``LD_PRELOAD`` value) with tcmalloc first, when it is installed and not
    there yet, and not turned off with ``$TRITONFORGE_NO_PRELOAD``."""
    lib = tcmalloc_path()
    if lib is None or os.environ.get(NO_PRELOAD_ENV) == "1" or "tcmalloc" in preload:
        return preload
    return f"{lib}:{preload}" if preload else lib
