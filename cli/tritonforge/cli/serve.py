"""`tritonforge serve`: prepare the model, start a real tritonserver, stream a first answer.

Parse -> build the repository (from a spec, a folder, or the default) -> prepare the models
it names -> start the server -> wait until ready -> (optionally) stream an answer -> serve
until Ctrl-C / SIGTERM, then stop everything (the server's whole process group).
"""

from __future__ import annotations

import hashlib
import itertools
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["default_repository", "model_references", "next_commands", "register", "response_cache_bytes", "serve"]


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    from rich.markup import escape

    _console(stderr=True).print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def default_repository() -> Path:
    """The checked-in default repository (a source checkout) or the one packaged in the wheel."""
    from tritonforge.runtime.paths import source_root

    root = source_root()
    if root is not None and (root / "model_repository").is_dir():
        return root / "model_repository"
    packaged = Path(__file__).resolve().parents[1] / "_data" / "model_repository"
    if packaged.is_dir():
        return packaged
    raise _fail("no default model repository found; pass a SPEC or --repo DIR", 2)


def _configs(repo: Path) -> dict[str, Any]:
    """Every model's config.pbtxt, parsed into Triton's own ``ModelConfig``."""
    from google.protobuf import text_format  # type: ignore[import-untyped]
    from tritonclient.grpc import model_config_pb2 as mc  # type: ignore[import-untyped]

    out: dict[str, Any] = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        cfg = mc.ModelConfig()
        try:
            text_format.Parse(path.read_text(), cfg)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            raise _fail(f"{path} is not a valid model config ({exc}); run `tritonforge validate {repo}`", 2) from None
        out[path.parent.name] = cfg
    return out


def model_references(repo: Path) -> list[str]:
    """Model references (``tritonforge_model`` / ``tritonforge_tokenizer``) the repository uses."""
    from tritonforge.contract import Param

    keys = (Param.MODEL.value, Param.TOKENIZER.value)
    return sorted({
        cfg.parameters[k].string_value
        for cfg in _configs(repo).values() for k in keys
        if k in cfg.parameters and cfg.parameters[k].string_value
    })


def _repository_from_spec(spec_path: Path) -> Path:
    from tritonforge.render.renderer import render_files
    from tritonforge.render.write import ValidationFailed, write_repository
    from tritonforge.runtime.paths import cache_dir
    from tritonforge.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        from rich.markup import escape

        con = _console(stderr=True)
        con.print(f"[bold red]error:[/] invalid spec {escape(str(spec_path))}")
        for line in exc.problems:
            con.print(f"  - {escape(line)}")
        raise typer.Exit(2) from None
    files = render_files(spec)
    digest = hashlib.sha256(b"".join(k.encode() + v for k, v in sorted(files.items()))).hexdigest()[:12]
    out = cache_dir() / "repositories" / f"{spec.name}-{digest}"
    if not out.is_dir():
        try:
            write_repository(out, files)
        except ValidationFailed as exc:
            raise _fail("the rendered repository failed validation:\n" + "\n".join(map(str, exc.problems))) from None
    return out


def response_cache_bytes(repo: Path) -> int:
    """The size of Triton's local response cache to start the server with: the same size
    the generated launch scripts use when any model of ``repo`` enables its response cache
    (Triton has no cache, and caches nothing, unless started with ``--cache-config``)."""
    from tritonforge.render.commands import RESPONSE_CACHE_BYTES

    enabled = any(cfg.response_cache.enable for cfg in _configs(repo).values())
    return RESPONSE_CACHE_BYTES if enabled else 0


def _served_model(repo: Path) -> str | None:
    return next((name for name, cfg in _configs(repo).items() if cfg.platform == "ensemble"), None)


def serve(
    spec: Annotated[
        Path | None,
        typer.Argument(help="Deployment spec (YAML) to generate and serve. Default: the "
                       "checked-in default repository (SmolLM2 on vLLM, CPU).", show_default=False),
    ] = None,
    repo: Annotated[
        Path | None, typer.Option("--repo", help="Serve this model repository folder as it is.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind. Loopback unless you say otherwise.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port (KServe v2 + generate).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = 8002,
    log_file: Annotated[
        Path | None, typer.Option(help="Server log file (default: in the cache folder).")
    ] = None,
    ask: Annotated[
        str | None,
        typer.Option(help="Once ready, stream the answer to this chat message, then keep serving."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="max_tokens for --ask.")] = 128,
    exit_after_ask: Annotated[
        bool, typer.Option("--exit-after-ask", help="Stop the server after answering --ask.")
    ] = False,
    restrict_admin: Annotated[
        bool,
        typer.Option(
            "--restrict-admin/--open-admin",
            help="Close Triton's model-repository, statistics, trace, logging and shared-memory "
            "APIs unless the request carries header admin-key: $TRITONFORGE_ADMIN_KEY "
            "(a random key is generated and printed when unset).",
        ),
    ] = True,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for the server.")] = 600.0,
    openai_port: Annotated[
        int | None,
        typer.Option(help="Also serve the OpenAI-compatible API (/v1/chat/completions, "
                     "/v1/completions) on this port, same --host; API key from "
                     "$TRITONFORGE_OPENAI_API_KEY if set."),
    ] = None,
    http_front: Annotated[
        bool,
        typer.Option("--http-front/--no-http-front",
                     help="Serve HTTP through tritonforge's front, which stops the engine when a "
                     "client leaves a non-streamed /generate or /infer call (Triton's HTTP "
                     "frontend does not notice); --no-http-front: Triton's HTTP port directly."),
    ] = True,
) -> None:
    """Serve a model with a real tritonserver (the bundled one, or one on PATH)."""
    from rich.markup import escape
    from tritonforge.runtime.models import ModelError, resolve_model
    from tritonforge.runtime.server import ServerError, ServerOptions, TritonServer

    con = _console()
    if spec is not None and repo is not None:
        raise _fail("give either SPEC or --repo, not both", 2)
    if spec is not None:
        if not spec.is_file():
            raise _fail(f"spec {spec} does not exist", 2)
        repository = _repository_from_spec(spec)
    elif repo is not None:
        if not (repo.is_dir() and any(repo.glob("*/config.pbtxt"))):
            raise _fail(f"{repo} is not a model repository (no */config.pbtxt)", 2)
        from tritonforge.render.validate import validate_repository

        problems = validate_repository(repo)
        if problems:
            raise _fail(f"{repo} is not a servable repository ({len(problems)} problem(s)):\n"
                        + "\n".join(f"  - {p}" for p in problems)
                        + f"\nfix them (`tritonforge validate {repo}` checks again) or regenerate it "
                        "from its spec with `tritonforge generate`", 2)
        repository = repo.resolve()
    else:
        repository = default_repository()
    for port in (http_port, grpc_port, metrics_port) + ((openai_port,) if openai_port else ()):
        if not 0 < port < 65536:
            raise _fail(f"port {port} is out of range (1-65535)", 2)

    started = time.monotonic()
    for ref in model_references(repository):
        with con.status(f"preparing model {escape(ref)} (once; cached afterwards)") as status:
            try:
                path = resolve_model(ref, progress=lambda msg, ref=ref: status.update(f"{escape(ref)}: {escape(msg)}"))
            except ModelError as exc:
                raise _fail(str(exc), 2) from None
        con.print(f"model {escape(ref)} -> {escape(str(path))}")

    options = ServerOptions(
        repository=repository, host=host, http_port=http_port, grpc_port=grpc_port,
        metrics_port=metrics_port, log_file=log_file, restrict_admin=restrict_admin,
        response_cache_bytes=response_cache_bytes(repository), front=http_front,
    )
    try:
        server = TritonServer(options)
    except ServerError as exc:
        raise _fail(str(exc)) from None

    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    gateway: Any = None
    try:
        con.print(f"tritonserver {escape(str(server.install.binary))}\n  repository {escape(str(repository))}\n"
                  f"  log {escape(str(server.log_file))}")
        with con.status("starting tritonserver (the engine loads in ~20-60 s on CPU)") as status:
            try:
                waited = server.start_ready(ready_timeout, on_tick=lambda s: _tick(status, s, stop))
            except (ServerError, KeyboardInterrupt) as exc:
                server.stop()
                if stop.is_set():
                    raise typer.Exit(130) from None
                raise _fail(str(exc)) from None
        if server.restarts_after_crash:
            con.print(f"[yellow]note:[/] tritonserver aborted while loading (a known intermittent "
                      f"Python-backend crash) and was started again ({server.restarts_after_crash}x)")
        model = _served_model(repository)
        con.print(f"[bold green]ready[/] in {waited:.1f} s (total {time.monotonic() - started:.1f} s): "
                  f"HTTP {options.http_url}  gRPC {options.grpc_url}  metrics {options.metrics_url}"
                  + (f"  model [bold]{escape(model)}[/]" if model else ""))
        if restrict_admin and server.admin_key:
            con.print(f"admin APIs need header [bold]admin-key: {escape(server.admin_key)}[/] "
                      "(set TRITONFORGE_ADMIN_KEY to choose it)")
        if openai_port and model:
            import os

            from tritonforge.gateway.runner import run_gateway_in_thread

            try:
                gateway = run_gateway_in_thread(
                    options.grpc_url, model, host, openai_port,
                    os.environ.get("TRITONFORGE_OPENAI_API_KEY") or None,
                )
            except RuntimeError as exc:
                raise _fail(f"OpenAI gateway: {exc}") from None
            con.print(f"OpenAI API on http://{options.endpoint(openai_port)}/v1")
        if model:
            _print_next_commands(options, model, openai_port)
        if ask and model:
            _ask(options.grpc_url, model, ask, max_tokens)
            if exit_after_ask:
                stop.set()
        if not stop.is_set():
            con.print("serving; Ctrl-C to stop")
        restarts: list[float] = []  # when serve restarted a failed server (bounded below)
        ticks = itertools.count()
        while not stop.is_set():
            # An exit or a restart file is seen within a tick; a dead stub, a dead engine or
            # a wedge (the /proc walk and metrics scrape) within DEEP_CHECK_TICKS of them.
            why, tail = server.failure(deep=next(ticks) % DEEP_CHECK_TICKS == 0)
            if why is not None:
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_SECONDS]
                if len(restarts) >= MAX_RESTARTS:
                    raise _fail(f"{why}, {len(restarts) + 1} times within {RESTART_WINDOW_SECONDS:.0f} s: "
                                f"not restarting again.\n{tail}")
                restarts.append(now)
                con.print(f"[bold red]{escape(why)}[/]: restarting tritonserver")
                if tail:
                    con.print(escape(tail), style="dim", highlight=False)
                server.stop()
                try:
                    waited = server.start_ready(ready_timeout, on_tick=lambda s: _tick(None, s, stop))
                except (ServerError, KeyboardInterrupt) as exc:
                    if stop.is_set():
                        break
                    raise _fail(f"restart failed: {exc}") from None
                con.print(f"[bold green]ready again[/] in {waited:.1f} s")
            stop.wait(0.5)
    finally:
        if gateway is not None:
            gateway.stop()
        was_running = server.process is not None
        code = server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if was_running:
            con.print(f"stopped (tritonserver exit code {code})")


# serve restarts a server that failed while serving (tritonserver exited, a stub or an engine
# died, or a model wedged: ``TritonServer.failure``) at most this many times within this window, then gives up with the server's log.
MAX_RESTARTS = 3
# serve checks the server every 0.5 s; the checks that read /proc and scrape the metrics
# endpoint every this many ticks (2 s): polled every tick they cost ~1 % of a core, which on a
# 2-core machine comes out of the model's threads (benchmarks/bench_peer.py at c=1).
DEEP_CHECK_TICKS = 4
RESTART_WINDOW_SECONDS = 600.0


def _self_command() -> str:
    """How this ``tritonforge`` was typed (``.venv/bin/tritonforge``), for commands to copy."""
    import os

    argv0 = Path(sys.argv[0])
    if argv0.name != "tritonforge":
        return "tritonforge"
    if argv0.is_absolute():
        try:
            return str(argv0.relative_to(Path.cwd()))
        except ValueError:
            return str(argv0)
    return sys.argv[0] if os.sep in sys.argv[0] else "tritonforge"


def next_commands(options: Any, model: str, openai_port: int | None) -> list[str]:
    """The commands a newcomer can paste next, for this server's ports (plain text)."""
    import json
    import shlex

    from tritonforge.clients._base import DEFAULT_PORTS

    me = _self_command()
    url = "" if options.grpc_url == f"127.0.0.1:{DEFAULT_PORTS['grpc']}" else f" --url {options.grpc_url}"
    body = json.dumps({"id": "1", "text_input": "Once upon a time", "max_tokens": 32})
    lines = [
        f'{me} complete "Once upon a time" --max-tokens 32{url}',
        f"{me} chat{url}",
        f"curl -N -X POST {options.http_url}/v2/models/{model}/generate_stream -d {shlex.quote(body)}",
    ]
    if openai_port:
        lines.append(f"# OpenAI SDK: base_url=http://{options.endpoint(openai_port)}/v1  model={model}")
    else:
        gw = "" if not url else f" --triton-url {options.grpc_url}"
        lines.append(f"# OpenAI API: serve with --openai-port 9000, or run `{me} gateway{gw}` "
                     "(then base_url=http://127.0.0.1:8080/v1)")
    return lines


def _print_next_commands(options: Any, model: str, openai_port: int | None) -> None:
    # Plain print, not rich: the lines must stay exactly as typed (no wrapping, no markup).
    print("try next, in another terminal from this folder:", flush=True)
    for line in next_commands(options, model, openai_port):
        print(f"  {line}", flush=True)


def _tick(status: Any, seconds: float, stop: threading.Event) -> None:
    if stop.is_set():
        raise KeyboardInterrupt
    if status is not None:
        status.update(f"starting tritonserver ... {seconds:.0f} s")


def _ask(url: str, model: str, prompt: str, max_tokens: int) -> None:
    from tritonforge.clients import Client, TritonForgeError

    con = _console()
    con.print(f"[bold]> {prompt}[/]")
    try:
        with Client(url, model=model) as client, client.stream(
            messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
        ) as stream:
            for chunk in stream:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            done = stream.completion
        sys.stdout.write("\n")
        ttft = f"{done.ttft * 1000:.0f} ms" if done.ttft is not None else "-"
        con.print(f"[dim]{done.completion_tokens} tokens, TTFT {ttft}, "
                  f"finish {done.finish_reason.value or '-'}[/]")
    except TritonForgeError as exc:
        _console(stderr=True).print(f"[bold red]error:[/] {exc}")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
