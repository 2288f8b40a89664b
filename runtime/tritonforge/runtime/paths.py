"""Where tritonforge keeps prepared models, server layouts and logs."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "source_root"]

CACHE_ENV = "TRITONFORGE_CACHE"


def source_root() -> Path | None:
    """The repository checkout this package runs from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / "generators" / "tritonforge").is_dir():
        return root
    return None


def cache_dir() -> Path:
    """The project cache folder: ``$TRITONFORGE_CACHE``, else ``<checkout>/.cache``, else
    ``~/.cache/tritonforge``. Created on first use."""
    env = os.environ.get(CACHE_ENV)
    if env:
        path = Path(env)
    elif (root := source_root()) is not None:
        path = root / ".cache"
    else:
        path = Path.home() / ".cache" / "tritonforge"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
