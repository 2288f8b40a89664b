"""`tritonforge generate` and `tritonforge validate` (owned by the generator work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
