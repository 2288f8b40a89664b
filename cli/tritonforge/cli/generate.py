"""`tritonforge generate` and `tritonforge validate`.

Exit codes: 0 ok; 1 drift (``--check``) or validation failure; 2 bad spec or usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["generate", "register", "validate"]


def _console(stderr: bool = True):  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _fail(title: str, lines: list[str], code: int) -> typer.Exit:
    from rich.markup import escape

    con = _console()
    con.print(f"[bold red]error:[/] {escape(title)}")
    for line in lines:
        con.print(f"  - {escape(line)}")
    return typer.Exit(code)


def generate(
    spec: Annotated[Path, typer.Argument(help="Deployment spec (YAML).", metavar="SPEC", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Model repository folder to "
                                         "write (replaced atomically).", show_default=False)],
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 and print a "
                                        "unified diff when OUTPUT differs from what SPEC "
                                        "renders.")] = False,
) -> None:
    """Render SPEC into a validated Triton model repository at OUTPUT."""
    from tritonforge.render.renderer import render_files
    from tritonforge.render.write import OutputError, ValidationFailed, diff_tree, write_repository
    from tritonforge.spec import SpecError, load_spec

    try:
        parsed = load_spec(spec)
    except SpecError as exc:
        raise _fail(f"invalid spec {spec}", exc.problems, 2) from None
    files = render_files(parsed)
    if check:
        if output.exists() and not output.is_dir():
            raise _fail(f"{output} is not a folder", [], 2)
        diff = diff_tree(output, files)
        if diff:
            typer.echo(diff, nl=False)
            raise _fail(f"{output} differs from what {spec} renders; run "
                        f"`tritonforge generate {spec} --output {output}`", [], 1)
        _console().print(f"{output} is up to date with {spec}")
        return
    try:
        write_repository(output, files)
    except OutputError as exc:
        raise _fail(str(exc), [], 2) from None
    except ValidationFailed as exc:
        raise _fail(f"the rendered repository failed validation; {output} is unchanged",
                    [str(p) for p in exc.problems], 1) from None
    except OSError as exc:
        raise _fail(f"cannot write {output}: {exc}; it is unchanged", [], 1) from None
    models = sorted({p.split("/")[0] for p in files if p.endswith("/config.pbtxt")})
    _console().print(f"wrote {output}: {', '.join(models)} (served model: {parsed.name})")


def validate(
    directory: Annotated[Path, typer.Argument(help="Model repository folder.", metavar="DIR",
                                              show_default=False)],
) -> None:
    """Check a model repository: configs parse, ensemble wiring, streaming, parameters."""
    from tritonforge.render.validate import validate_repository

    if not directory.is_dir():
        raise _fail(f"{directory} is not a folder", [], 2)
    problems = validate_repository(directory)
    if problems:
        raise _fail(f"{directory}: {len(problems)} problem(s)", [str(p) for p in problems], 1)
    _console().print(f"{directory}: ok")


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("validate")(validate)
