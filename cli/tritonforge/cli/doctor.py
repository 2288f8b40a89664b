"""`tritonforge doctor`: check the serving environment; `--explain` diagnoses an error text or log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["doctor", "register"]

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}
_MAX_LOG_BYTES = 16 * 1024 * 1024


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=160)


def _read_explain_input(value: str) -> tuple[str, str]:
    """(text, where it came from): a readable file path is read (its last 16 MiB), anything
    else is the error text itself; "-" reads standard input."""
    import sys

    if value == "-":
        return sys.stdin.read(), "standard input"
    path = Path(value)
    try:
        is_file = len(value) < 4096 and "\n" not in value and path.is_file()
    except OSError:
        is_file = False
    if is_file:
        with path.open("rb") as fh:
            size = path.stat().st_size
            if size > _MAX_LOG_BYTES:
                fh.seek(size - _MAX_LOG_BYTES)
            return fh.read().decode("utf-8", errors="replace"), str(path)
    return value, "the given text"


def _explain(value: str) -> None:
    from rich.markup import escape
    from rich.table import Table
    from tritonforge.runtime.doctor import explain

    text, source = _read_explain_input(value)
    found = explain(text)
    con = _console()
    if not found:
        _console(stderr=True).print(
            f"[bold yellow]no known deployment error recognised in {escape(source)}[/]; "
            "docs/reliability.md lists the ones tritonforge doctor knows"
        )
        raise typer.Exit(1)
    table = Table(title=f"diagnosis of {escape(source)}", show_lines=True)
    table.add_column("problem", style="bold")
    table.add_column("cause")
    table.add_column("fix")
    for d in found:
        table.add_row(f"{escape(d.title)}\n[dim]{d.key}[/]", escape(d.cause), escape(d.fix))
    con.print(table)


def doctor(
    explain: Annotated[
        str | None,
        typer.Option("--explain", help="Diagnose this error text, or a log file's content ('-': stdin), "
                     "instead of checking the environment."),
    ] = None,
    repo: Annotated[
        Path | None, typer.Option("--repo", help="Model repository whose models must be prepared "
                                  "(default: the checked-in default repository).")
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="HTTP address of a running server to check "
                                 "(instead of checking that the ports are free).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address the server would bind.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port the server would use.")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port the server would use.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Metrics port the server would use.")] = 8002,
    engine: Annotated[
        bool, typer.Option("--engine/--no-engine", help="Import vLLM in a subprocess (slow: ~10-60 s).")
    ] = True,
    engine_timeout: Annotated[float, typer.Option(help="Seconds the engine import may take.")] = 300.0,
) -> None:
    """Check the environment tritonforge serves in (exit 1 on any failure), or explain an error."""
    if explain is not None:
        _explain(explain)
        return
    from rich.markup import escape
    from rich.table import Table
    from tritonforge.runtime.doctor import Status, run_checks

    if repo is None:
        from tritonforge.runtime.paths import source_root

        root = source_root()
        candidate = root / "model_repository" if root is not None else None
        repo = candidate if candidate is not None and candidate.is_dir() else None
    elif not repo.is_dir():
        _console(stderr=True).print(f"[bold red]error:[/] {escape(str(repo))} is not a folder")
        raise typer.Exit(2)
    con = _console()
    with con.status("checking (the engine import takes a while)"):
        results = run_checks(repo=repo, url=url, host=host, ports=(http_port, grpc_port, metrics_port),
                             engine=engine, engine_timeout=engine_timeout)
    table = Table(title="tritonforge doctor", show_lines=False)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    table.add_column("fix")
    for r in results:
        style = _STYLE[r.status.value]
        table.add_row(escape(r.name), f"[{style}]{r.status.value}[/]", escape(r.detail), escape(r.fix))
    con.print(table)
    failed = [r for r in results if r.status is Status.FAIL]
    warned = [r for r in results if r.status is Status.WARN]
    con.print(f"{len(results)} checks: {len(results) - len(failed) - len(warned)} ok, "
              f"{len(warned)} warn, {len(failed)} fail")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
