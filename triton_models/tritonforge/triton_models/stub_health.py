"""Keep a Python-backend stub's health thread on the CPU when the machine is overloaded.

Triton's Python backend (2.51, ``stub_launcher.cc`` ``ReceiveMessageFromStub``) waits for a
stub's reply in 1-second rounds: it clears a health flag in shared memory, waits up to 1 s,
and if no reply came and the flag is still clear it fails the request with "Stub process
'<instance>' is not healthy." The flag is set every 300 ms by one C++ thread of the stub
(``pb_stub.cc`` ``main``: the background thread started right after the interpreter, before
the queue monitors and the model). The deadline is fixed in the backend; on a busy 2-core
machine (load average 11) that thread was measured waiting 1.07 s on the run queue, and a
request fails so while the stub is healthy.

So every tritonforge model, in ``initialize()``, raises that one thread's priority (it runs a
few microseconds every 300 ms, so it takes nothing from the rest). That needs CAP_SYS_NICE
(root, or ``cap_add: [SYS_NICE]`` in a container); without it the thread stays as it was and
:func:`favour_health_thread` says why.
"""

from __future__ import annotations

import os
from pathlib import Path

# nice value of the health thread: well above the engine's and the tokenizers' threads (0)
HEALTH_NICE = -10


def _start_ticks(task: Path) -> int:
    # field 22 of /proc/<pid>/task/<tid>/stat: start time in clock ticks since boot
    return int((task / "stat").read_text().rsplit(")", 1)[1].split()[19])


def health_thread(pid: int | None = None) -> int | None:
    """The stub's health thread: the first thread it started after its main thread (by start
    time, then thread id); None when the process has no second thread."""
    pid = os.getpid() if pid is None else pid
    tasks = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            tasks.append((_start_ticks(task), int(task.name)))
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    later = sorted(t for t in tasks if t[1] != pid)
    return later[0][1] if later else None


def favour_health_thread(pid: int | None = None) -> str | None:
    """Give the stub's health thread nice ``HEALTH_NICE``; None when done, else why not."""
    tid = health_thread(pid)
    if tid is None:
        return "no health thread found in this stub"
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) > HEALTH_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, HEALTH_NICE)
    except PermissionError:
        return (f"the stub's health thread stays at nice {os.getpriority(os.PRIO_PROCESS, tid)}: "
                "raising it needs CAP_SYS_NICE (run as root, or add SYS_NICE to the container's "
                "capabilities); on an overloaded CPU Triton may then fail requests with "
                "'Stub process ... is not healthy'")
    except ProcessLookupError:
        return "the stub's health thread ended"
    return None
