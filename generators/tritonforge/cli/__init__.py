"""The ``tritonforge`` command line (typer + rich).

One module per command group; each exposes ``register(app)``. Entry points stay thin:
parse, build the typed config, call the library, map user errors to exit codes.
Exit codes: 0 ok, 1 check/drift/validation failure or runtime failure, 2 bad input/usage.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tritonforge",
    help="Serve LLMs on NVIDIA Triton Inference Server, boringly reliably.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    # Imported lazily so that `tritonforge --help` stays fast and one broken group cannot
    # take the others down at import time.
    from tritonforge.cli import doctor, gateway, generate, serve

    for module in (generate, serve, gateway, doctor):
        module.register(app)
    try:  # these live in other source folders of the package
        from tritonforge.cli import client_commands
        client_commands.register(app)
    except ImportError:
        pass
    try:
        from tritonforge.cli import loadtest
        loadtest.register(app)
    except ImportError:
        pass


def main() -> None:
    _register_all()
    app()
