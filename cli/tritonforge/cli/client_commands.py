"""``tritonforge complete "prompt"`` and ``tritonforge chat``: the typed client on the terminal.

Both stream the reply as it is generated (``--json`` prints one JSON object per reply
instead: text, finish reason, token counts, TTFT and latencies). Any failure prints one
line on stderr and exits non-zero: 2 for a refused request, 1 otherwise.
"""

from __future__ import annotations

import enum
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the clients (grpc, httpx) load only when a command runs
    from tritonforge.clients import Client, Completion, Request

__all__ = ["register"]


class ProtocolChoice(str, enum.Enum):
    grpc = "grpc"
    http = "http"


ProtocolOpt = Annotated[
    ProtocolChoice, typer.Option("--protocol", "-p", help="Transport to the server.")
]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", "-u", help="Server HOST:PORT (default: 127.0.0.1:8001 for grpc, :8000 for http)."),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model to call (default: the one ensemble the server serves)."),
]
MaxTokensOpt = Annotated[
    int | None, typer.Option("--max-tokens", "-n", help="Maximum tokens to generate (default: the deployment's).")
]
TemperatureOpt = Annotated[
    float | None, typer.Option("--temperature", "-t", help="Sampling temperature; 0 is greedy (default: the deployment's).")
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Deadline of each request, seconds.")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON object per reply (text, finish_reason, tokens, ttft, latencies).")
]

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
CHAT_EXIT = "/exit"


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _client(protocol: ProtocolChoice, url: str | None, model: str | None, timeout: float) -> Client:
    from tritonforge.clients import Client

    return Client(url, protocol=protocol.value, model=model, timeout=timeout)


def _run(client: Client, request: Request, as_json: bool) -> Completion:
    """Stream one request to stdout (or print its JSON summary); the Completion."""
    with client.stream(request) as stream:
        for chunk in stream:
            if not as_json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        done = stream.completion
    if as_json:
        typer.echo(json.dumps(done.to_dict(), ensure_ascii=False))
    else:
        typer.echo("")
    return done


def _guard(fn: Any, *args: Any) -> Any:
    """Run ``fn``; turn client errors and Ctrl-C into one line and an exit code."""
    from tritonforge.clients import InvalidRequest, ServerUnavailable, TritonForgeError

    try:
        return fn(*args)
    except InvalidRequest as exc:
        raise _fail(f"invalid request: {exc}", EXIT_BAD_INPUT) from None
    except ServerUnavailable as exc:
        raise _fail(f"cannot reach the server: {exc}", EXIT_FAILURE) from None
    except TritonForgeError as exc:
        raise _fail(str(exc), EXIT_FAILURE) from None
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def complete(
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    protocol: ProtocolOpt = ProtocolChoice.grpc,
    url: UrlOpt = None,
    model: ModelOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    timeout: TimeoutOpt = 300.0,
    as_json: JsonOpt = False,
) -> None:
    """Complete PROMPT with the served model, streaming the text as it is generated."""
    from tritonforge.clients import Request

    def go() -> None:
        with _client(protocol, url, model, timeout) as client:
            request = client.build_request(
                Request(prompt=prompt, max_tokens=max_tokens, temperature=temperature), {}
            )
            _run(client, request, as_json)

    _guard(go)


def chat(
    protocol: ProtocolOpt = ProtocolChoice.grpc,
    url: UrlOpt = None,
    model: ModelOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = None,
    timeout: TimeoutOpt = 300.0,
    system: Annotated[str | None, typer.Option("--system", help="A system message opening the chat.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Chat with the served model (the chat template is applied by the server).

    Each reply streams as it is generated; the whole conversation is sent every turn.
    Type /exit (or Ctrl-D) to leave.
    """
    from tritonforge.clients import Request

    def go() -> None:
        history: list[dict[str, str]] = []
        if system:
            history.append({"role": "system", "content": system})
        with _client(protocol, url, model, timeout) as client:
            while True:
                try:
                    line = input("> " if sys.stdin.isatty() else "")
                except EOFError:
                    return
                text = line.strip()
                if text == CHAT_EXIT:
                    return
                if not text:
                    continue
                history.append({"role": "user", "content": text})
                request = client.build_request(
                    Request(messages=history, max_tokens=max_tokens, temperature=temperature), {}
                )
                done = _run(client, request, as_json)
                history.append({"role": "assistant", "content": done.text})

    _guard(go)


def register(app: typer.Typer) -> None:
    app.command("complete")(complete)
    app.command("chat")(chat)
