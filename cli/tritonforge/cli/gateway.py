"""``tritonforge gateway``: serve the OpenAI API (chat/completions, completions, models) over Triton.

Parse -> check the options (URL, port free) -> serve with uvicorn until Ctrl-C / SIGTERM.
User errors print one line on stderr: exit 2 for bad options, 1 when it cannot serve.
"""

from __future__ import annotations

import enum
import errno
import socket
from typing import Annotated

import typer

__all__ = ["gateway", "register"]

API_KEY_ENV = "TRITONFORGE_OPENAI_API_KEY"  # the same name as tritonforge.gateway.API_KEY_ENV
MODEL_ENV = "TRITONFORGE_MODEL"  # as the load tests read it


class ProtocolChoice(str, enum.Enum):
    grpc = "grpc"
    http = "http"


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or ``None``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve --host {host!r}: {exc.strerror}"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use; pick another --port"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def gateway(
    triton_url: Annotated[str, typer.Option(
        "--triton-url", help="Triton HOST:PORT: its gRPC port (or its HTTP port with --protocol http).")]
        = "127.0.0.1:8001",
    protocol: Annotated[ProtocolChoice, typer.Option("--protocol", help="Transport to Triton.")]
        = ProtocolChoice.grpc,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", envvar=MODEL_ENV, show_envvar=True,
        help="Triton ensemble to serve, also its OpenAI model id (default: the one ensemble served;"
             " discovering it needs $TRITONFORGE_ADMIN_KEY when Triton restricts its index).")]
        = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar=API_KEY_ENV, show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on /v1/* (default: no key).")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.001, help="Deadline of each request towards Triton, seconds.")] = 300.0,
) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) over Triton."""
    from tritonforge.clients import InvalidRequest
    from tritonforge.clients._base import normalise_url
    from tritonforge.gateway import GatewayConfig, run_gateway

    try:
        normalise_url(triton_url, protocol.value)
    except InvalidRequest as exc:
        raise _fail(f"--triton-url: {exc}", 2) from None
    if api_key is not None and not api_key.strip():
        raise _fail(f"--api-key / ${API_KEY_ENV} is empty; unset it to serve without a key", 2)
    model = model.strip() if model and model.strip() else None  # empty: discover
    problem = _port_problem(host, port)
    if problem is not None:
        raise _fail(problem, 1)
    cfg = GatewayConfig(triton_url=triton_url, protocol=protocol.value, model=model,
                        api_key=api_key, timeout=timeout)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"OpenAI API on http://{shown}:{port}/v1 -> Triton {protocol.value} {triton_url}"
               f" (model: {model or 'the one ensemble served'}; API key {'required' if api_key else 'off'})",
               err=True)
    run_gateway(cfg, host, port)


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
