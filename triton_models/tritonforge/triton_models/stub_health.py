"""Keep a Python-backend stub's health thread on the CPU when the machine is overloaded.

Triton's Python backend (2.51, ``stub_launcher.cc`` ``ReceiveMessageFromStub``) waits for a
stub's reply in 1-second rounds: it clears a health flag in shared memory, waits up to 1 s,
and if no reply came and the flag is still clear it fails the request with "Stub process
'<instance>' is not healthy." The flag is set every 300 ms by one C++ thread of the stub
(``pb_stub.cc`` ``main``: the background thread started right after the interpreter, before
the queue monitors and the model). The deadline is fixed in the backend, and a missed one is
worse than one failed request: the backend has already sent the stub the request, the stub's
late reply stays in the queue and is taken as the answer to the *next* request, whose reply
memory the stub has freed by then -- tritonserver crashed with SIGSEGV (or hung) after a 2.5 s
stall of the postprocessing stub (``tests/test_reliability_stub_health.py``).

So every tritonforge model, in ``initialize()``, puts that one thread in the real-time class
(``SCHED_FIFO`` at the lowest priority, reset on fork): it runs a few microseconds every
300 ms, so it takes nothing from the rest, and no time-shared thread can keep it waiting.
Measured on a 2-core machine at load average 18 (28 busy loops, most in other sessions):
a 300-ms sleeper woke at most 22 ms late at nice 0 or -10, and 0.1 ms late as SCHED_FIFO 1.
That needs CAP_SYS_NICE (root, or ``cap_add: [SYS_NICE]`` in a container); without it the
thread gets nice ``HEALTH_NICE`` where allowed, else stays as it was, and
:func:`favour_health_thread` says why.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The health thread's real-time priority (SCHED_FIFO; 1 is the lowest real-time priority,
# above every time-shared thread) and, without the right to it, its nice value.
HEALTH_RT_PRIORITY = 1
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
    """Put the stub's health thread in SCHED_FIFO at ``HEALTH_RT_PRIORITY`` (else nice
    ``HEALTH_NICE``); None when done, else why not."""
    tid = health_thread(pid)
    if tid is None:
        return "no health thread found in this stub"
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                              os.sched_param(HEALTH_RT_PRIORITY))
        return None
    except PermissionError:
        pass
    except ProcessLookupError:
        return "the stub's health thread ended"
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) > HEALTH_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, HEALTH_NICE)
        how = f"nice {HEALTH_NICE}"
    except PermissionError:
        how = f"nice {os.getpriority(os.PRIO_PROCESS, tid)}"
    except ProcessLookupError:
        return "the stub's health thread ended"
    return (f"the stub's health thread runs at {how}, not in the real-time class: that needs "
            "CAP_SYS_NICE (run as root, or add SYS_NICE to the container's capabilities); on an "
            "overloaded CPU Triton may then fail requests with 'Stub process ... is not healthy'")


# ----------------------------------------------------------------------------------------
# A stall the real-time class cannot prevent (the whole stub stopped: memory reclaim, a
# stopped or descheduled virtual CPU) may still miss the deadline, and then the model is a
# time bomb: its next request crashes tritonserver (measured: a 2.5 s stall of one ``_sync``
# stub during a request; the server looked healthy until the next ``_sync`` request, which
# got an empty error, and the one after it crashed the server with SIGSEGV). So each stub
# watches its own health thread and asks for a restart of the server before that.

# The backend misses the deadline only if the health thread (a beat every ~300 ms) stayed
# silent for a whole 1-s round while it waited on this stub: a silence this long is suspect.
STALL_SUSPECT_SECONDS = 0.9
HEALTH_BEAT_SECONDS = 0.3  # the health thread's period (pb_stub.cc)
# How often the watcher looks (a look costs a read of /proc and a wakeup of an otherwise
# idle stub; a 0.9-s silence is still seen within 0.2 s; not the beat's own period, which is
# how tests/test_reliability_stub_health.py tells the health thread from the others), and how
# long after a stall an execute that starts still counts as one the backend was waiting for
# (its request arrived during the stall; one that started and ended between two looks is
# counted).
WATCH_SECONDS = 0.2
AFTER_STALL_SECONDS = 0.5


_VOLUNTARY = b"\nvoluntary_ctxt_switches:"


def _beat_counter(pid: int, tid: int) -> Callable[[], int]:
    """The thread's voluntary context switches (one per 300-ms sleep of the health thread),
    read from its ``/proc`` status file, which stays open: each look is one ``pread``."""
    fd = os.open(f"/proc/{pid}/task/{tid}/status", os.O_RDONLY | os.O_CLOEXEC)

    def beats() -> int:
        status = os.pread(fd, 8192, 0)
        at = status.index(_VOLUNTARY) + len(_VOLUNTARY)
        return int(status[at:status.index(b"\n", at)])

    return beats


class StallWatch:
    """Watches this stub's health thread and the model's ``execute`` calls; when the thread
    (or the whole stub) was silent for :data:`STALL_SUSPECT_SECONDS` while the backend may
    have been waiting for this stub (an execute running then, or starting right after), it
    writes the reason to the restart file the launcher named
    (``contract.RESTART_FILE_ENV``) and logs it; ``serve`` then restarts the server.

    ``clock``/``beats`` are injectable for tests of the rule (:meth:`observe`)."""

    def __init__(self, name: str, restart_file: str | None, clock: Callable[[], float] = time.monotonic,
                 beats: Callable[[], int] | None = None) -> None:
        self.name = name
        self.restart_file = restart_file
        self.clock = clock
        if beats is None:
            tid = health_thread()
            beats = _beat_counter(os.getpid(), tid) if tid is not None else (lambda: 0)
        self._beats: Callable[[], int] = beats
        self._lock = threading.Lock()
        self._running = 0  # executes in progress
        self._started = 0  # executes started, ever
        self._last_count = beats()
        self._last_beat = self._last_seen = clock()
        self._suspect: tuple[float, float, int] | None = None  # (silence, seen at, starts then)
        self.reported: str | None = None

    def track(self, execute: Callable[..., Any]) -> Callable[..., Any]:
        """``execute`` counted as running while it runs."""

        @functools.wraps(execute)
        def tracked(requests: Any) -> Any:
            with self._lock:
                self._running += 1
                self._started += 1
            try:
                return execute(requests)
            finally:
                with self._lock:
                    self._running -= 1

        return tracked

    def observe(self) -> str | None:
        """One look; the reason (also written and logged) once a suspect stall is confirmed."""
        now, count = self.clock(), self._beats()
        if self.reported is not None:
            return None
        silence = now - self._last_beat if count == self._last_count else 0.0
        # The watcher itself may have been held up (the whole stub stopped, or the GIL): time
        # since its last look that the beats seen since do not cover is silence too.
        uncovered = (now - self._last_seen) - HEALTH_BEAT_SECONDS * (count - self._last_count + 1)
        silence = max(silence, uncovered)
        self._last_seen = now
        if count != self._last_count:
            self._last_count, self._last_beat = count, now
        with self._lock:
            running, started = self._running, self._started
        if silence >= STALL_SUSPECT_SECONDS and self._suspect is None:
            self._suspect = (silence, now, started)
            if running:
                return self._report(silence)
        if self._suspect is not None:
            silence0, seen, started0 = self._suspect
            if running or started != started0:
                return self._report(silence0)
            if now - seen > AFTER_STALL_SECONDS:
                self._suspect = None  # nobody waited on this stub during the stall
        return None

    def _report(self, silence: float) -> str:
        why = (f"the Python-backend stub of {self.name!r} stalled {silence:.1f} s while serving; "
               "Triton 2.51 may have declared it unhealthy and taken its late reply for the next "
               "request's (it then crashes on that model's next request)")
        self.reported = why
        logging.getLogger("tritonforge.stub").error("%s: asking for a server restart", why)
        if self.restart_file:
            with contextlib.suppress(OSError):
                Path(self.restart_file).write_text(why + "\n")
        return why

    def run(self) -> None:
        while True:
            time.sleep(WATCH_SECONDS)
            with contextlib.suppress(Exception):  # a vanished /proc entry: next look
                self.observe()

    def start(self) -> StallWatch:
        threading.Thread(target=self.run, name="tritonforge-stall-watch", daemon=True).start()
        return self
