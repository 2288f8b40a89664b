"""Running the gateway: in the foreground (the CLI) or on a background thread (tests,
``tritonforge serve --openai-port``)."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Final

import uvicorn
from tritonforge.clients._base import Protocol
from tritonforge.gateway.app import GatewayConfig, create_app
from typing_extensions import Self

__all__ = ["GatewayHandle", "run_gateway", "run_gateway_in_thread", "uvicorn_config"]

_START_TIMEOUT: Final = 30.0


def uvicorn_config(config: GatewayConfig, host: str, port: int) -> uvicorn.Config:
    """uvicorn settings for the gateway: uvloop/httptools when installed, no access log."""
    return uvicorn.Config(create_app(config), host=host, port=port, log_level="warning",
                          access_log=False, lifespan="on", timeout_graceful_shutdown=5)


def run_gateway(config: GatewayConfig, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Serve until Ctrl-C / SIGTERM, then return: a requested stop is a clean exit (0).

    uvicorn handles the signals (a graceful shutdown) and afterwards re-raises the one it
    caught with the handler that was installed before it; that handler is ours and only
    notes it, so the process does not die by the signal (exit 130) after stopping cleanly.
    """
    caught: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in stops}
    try:
        uvicorn.Server(uvicorn_config(config, host, port)).run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class GatewayHandle:
    """A gateway serving on a background thread; ``stop()`` shuts it down."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, host: str, port: int) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """The OpenAI base URL: ``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (open streams are cancelled) and wait for the thread to end."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_gateway_in_thread(
    triton_url: str,
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    *,
    protocol: Protocol = "grpc",
    timeout: float | None = None,
) -> GatewayHandle:
    """Start the gateway on a daemon thread and return once it accepts connections.

    ``port=0`` picks a free port (read it from ``handle.port``). ``timeout`` is the
    whole-request deadline towards Triton (default: the client's). Raises ``RuntimeError``
    when it cannot start (port taken, ...).
    """
    cfg = GatewayConfig(triton_url=triton_url, protocol=protocol, model=model, api_key=api_key)
    if timeout is not None:
        cfg = dataclasses.replace(cfg, timeout=timeout)
    server = uvicorn.Server(uvicorn_config(cfg, host, port))
    thread = threading.Thread(target=server.run, name="tritonforge-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            raise RuntimeError(f"the OpenAI gateway did not start on {host}:{port}")
        time.sleep(0.02)
    bound = port
    for srv in server.servers:
        for sock in srv.sockets:
            bound = int(sock.getsockname()[1])
            break
    return GatewayHandle(server, thread, host, bound)
