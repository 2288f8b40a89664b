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
    # Each command module imports its heavy dependencies inside its functions, so
    # registering every group keeps `tritonforge --help` fast.
    from tritonforge.cli import client_commands, doctor, gateway, generate, loadtest, serve

    for module in (generate, serve, client_commands, loadtest, gateway, doctor):
        module.register(app)


def main() -> None:
    _register_all()
    app()
