"""The Python backend's stub-health deadline under CPU overload (``triton_models.stub_health``).

Triton 2.51 fails a request with "Stub process '<instance>' is not healthy." when a stub's
health thread (which sets a flag every 300 ms) has not run for a 1-s round. On a busy 2-core
machine that thread waited on the run queue for over a second (seen in CI: one request of a
1,000-request test failed so). Every tritonforge model puts that one thread in the real-time
class (SCHED_FIFO).

The witnesses are the kernel's: each stub's thread scheduling policies, and which of its
threads is the one that wakes every 300 ms while the server is idle (its voluntary context
switches from /proc), not tritonforge's own choice of thread.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import descendants
from tritonforge.triton_models.stub_health import HEALTH_RT_PRIORITY

pytestmark = pytest.mark.server


def _stubs(server_pid: int) -> dict[int, str]:
    out = {}
    for pid in descendants(server_pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"triton_python_backend_stub"):
            out[pid] = args[8].decode()  # the instance name, e.g. preprocessing_0_0
    return out


def _switches(pid: int, tid: int) -> int:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")).split()[1])


def test_every_stubs_health_thread_and_only_it_runs_in_the_real_time_class(triton_server: Any) -> None:
    assert os.geteuid() == 0, "CI and this test run as root: the policy needs CAP_SYS_NICE"
    stubs = _stubs(triton_server.server.process.pid)
    assert len(stubs) >= 5, stubs  # preprocessing, engine, postprocessing, BLS, _sync x2
    raised = {}
    for pid, name in stubs.items():
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        policy = {t: os.sched_getscheduler(t) & ~os.SCHED_RESET_ON_FORK for t in tids}
        fifo = [t for t, p in policy.items() if p == os.SCHED_FIFO]
        assert len(fifo) == 1, (name, policy)
        assert os.sched_getparam(fifo[0]).sched_priority == HEALTH_RT_PRIORITY
        raised[pid] = fifo[0]

    # The idle server: the raised thread is the one that wakes every 300 ms (about 10 times
    # in 3 s); every other thread of the stub wakes far less often, or far more (a poller).
    before = {pid: {int(t): _switches(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")} for pid in stubs}
    time.sleep(3.0)
    for pid, name in stubs.items():
        woke = {tid: _switches(pid, tid) - n for tid, n in before[pid].items()}
        periodic = [tid for tid, n in woke.items() if 8 <= n <= 11]
        assert periodic == [raised[pid]], (name, raised[pid], woke)
