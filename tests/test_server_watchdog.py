"""The rules that make ``serve`` restart a server Triton 2.51's Python backend has broken:
``TritonServer.wedged`` (a model that stopped executing; on metrics text in the exposition
format Triton 2.51 writes) and ``stub_health.StallWatch`` (a stub that stalled past the
backend's 1-s health deadline while the backend waited on it; on a clock and beat count the
test moves). The real case -- a stub stopped for 2.5 s on a real server -- is in
test_reliability_engine_death.py."""

from __future__ import annotations

from pathlib import Path

from tritonforge.runtime.server import WEDGE_SECONDS, ServerInstall, ServerOptions, TritonServer
from tritonforge.triton_models.stub_health import WATCH_SECONDS, StallWatch


def _server() -> TritonServer:
    fake = ServerInstall(Path("tritonserver"), Path("backends"), None, (), bundled=False)
    return TritonServer(ServerOptions(repository=Path("repo")), install=fake)


def _metrics(pending: int, executed: int, running: int = 0) -> str:
    return "\n".join([
        "# HELP nv_inference_pending_request_count Instantaneous number of pending requests",
        f'nv_inference_pending_request_count{{model="postprocessing",version="1"}} {pending}',
        'nv_inference_pending_request_count{model="preprocessing",version="1"} 0',
        f'nv_inference_exec_count{{model="postprocessing",version="1"}} {executed}',
        'nv_inference_exec_count{model="preprocessing",version="1"} 7',
        f'tritonforge_engine_requests_running{{model="vllm_engine",version="1"}} {running}',
    ])


def test_waiting_requests_and_no_execution_for_the_window_is_wedged() -> None:
    server = _server()
    assert server.wedged(_metrics(3, 10), now=0.0) is None
    assert server.wedged(_metrics(5, 10), now=WEDGE_SECONDS - 1) is None
    why = server.wedged(_metrics(5, 10), now=WEDGE_SECONDS + 0.5)
    assert why is not None and "'postprocessing'" in why and "5 request(s) waiting" in why


def test_progress_nothing_waiting_or_a_busy_engine_restarts_the_window() -> None:
    server = _server()
    server.wedged(_metrics(3, 10), now=0.0)
    assert server.wedged(_metrics(3, 11), now=WEDGE_SECONDS) is None  # it executed one
    assert server.wedged(_metrics(3, 11), now=2 * WEDGE_SECONDS - 1) is None
    server.wedged(_metrics(0, 11), now=2 * WEDGE_SECONDS)  # nothing waits
    assert server.wedged(_metrics(2, 11), now=3 * WEDGE_SECONDS - 1) is None
    # a forwarding model (``_sync``) waits for the engine while the engine generates
    server.wedged(_metrics(2, 11, running=4), now=3 * WEDGE_SECONDS)
    assert server.wedged(_metrics(2, 11, running=4), now=5 * WEDGE_SECONDS) is None
    assert server.wedged(_metrics(2, 11), now=6 * WEDGE_SECONDS - 1) is None
    assert server.wedged(_metrics(2, 11), now=6 * WEDGE_SECONDS + 1) is not None


class _Stub:
    """A clock and the health thread's beat count, moved by the test."""

    def __init__(self) -> None:
        self.now, self.count = 0.0, 0

    def run(self, seconds: float, beating: bool = True, step: float = 0.1) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now += step
            if beating and round(self.now / 0.3, 6).is_integer():
                self.count += 1


def _watch(tmp_path: Path) -> tuple[StallWatch, _Stub, Path]:
    stub, restart = _Stub(), tmp_path / "restart"
    watch = StallWatch("postprocessing_0_0", str(restart), clock=lambda: stub.now, beats=lambda: stub.count)
    return watch, stub, restart


def _looks(watch: StallWatch, stub: _Stub, seconds: float, beating: bool = True) -> str | None:
    """The watcher looking every ``WATCH_SECONDS`` while the stub runs ``seconds``."""
    for _ in range(round(seconds / WATCH_SECONDS)):
        stub.run(WATCH_SECONDS, beating)
        if (why := watch.observe()) is not None:
            return why
    return None


def test_a_beating_health_thread_is_never_suspect(tmp_path: Path) -> None:
    watch, stub, restart = _watch(tmp_path)
    execute = watch.track(lambda requests: _looks(watch, stub, 5.0))
    assert execute([]) is None and not restart.exists()


def test_a_silent_health_thread_during_an_execute_asks_for_a_restart(tmp_path: Path) -> None:
    watch, stub, restart = _watch(tmp_path)
    execute = watch.track(lambda requests: _looks(watch, stub, 1.5, beating=False))
    why = execute([])
    assert why is not None and "'postprocessing_0_0' stalled" in why
    assert restart.read_text().strip() == why


def test_a_stopped_stub_whose_watcher_stopped_too_counts_by_the_missing_beats(tmp_path: Path) -> None:
    watch, stub, restart = _watch(tmp_path)

    def execute(requests: object) -> str | None:
        stub.run(2.5, beating=False)  # the whole process stopped (SIGSTOP): nobody looked
        stub.count += 1  # the health thread beats first when it resumes
        return watch.observe()

    assert watch.track(execute)([]) is not None and restart.exists()


def test_a_stall_with_no_execute_near_it_is_harmless(tmp_path: Path) -> None:
    watch, stub, restart = _watch(tmp_path)
    assert _looks(watch, stub, 2.0, beating=False) is None  # idle stub, nobody waited on it
    assert _looks(watch, stub, 1.0) is None
    assert watch.track(lambda requests: _looks(watch, stub, 1.0))([]) is None
    assert not restart.exists()


def test_an_execute_starting_right_after_a_stall_was_waited_for(tmp_path: Path) -> None:
    watch, stub, restart = _watch(tmp_path)
    stub.run(2.0, beating=False)  # stopped; a request arrived meanwhile
    assert watch.observe() is None
    stub.run(0.1)
    watch.track(lambda requests: None)([])  # the backend's request, served on resuming
    assert watch.observe() is not None and restart.exists()


def test_free_ports_are_outside_the_range_the_os_hands_out() -> None:
    """A port from bind(0) can be handed out again (vLLM's engine binds its sockets that way
    while Triton loads it, before Triton's HTTP service binds): free_port() picks below the
    kernel's ephemeral range, each port once per process, and each one binds."""
    import socket

    from tritonforge.runtime.server import free_port

    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports), (low, high, ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
