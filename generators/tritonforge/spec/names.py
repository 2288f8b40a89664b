"""The rule for names that become Triton model names or adapter names."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

__all__ = ["name_problem"]

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def name_problem(value: str, what: str = "a model name") -> str | None:
    """Why ``value`` is not a safe Triton model/adapter name, or None when it is."""
    bad: list[tuple[Callable[[str], bool], str]] = [
        (lambda v: "/" in v or "\\" in v, "a path separator"),
        (lambda v: "'" in v or '"' in v or "`" in v, "a quote"),
        (lambda v: "\n" in v or "\r" in v, "a newline"),
        (lambda v: "${" in v, "a '${' placeholder"),
        (lambda v: "{{" in v or "{%" in v, "a template marker"),
        (lambda v: "{" in v or "}" in v, "a brace"),
        (lambda v: ".." in v, "'..'"),
        (lambda v: v.startswith("."), "a leading '.'"),
        (lambda v: any(c.isspace() for c in v), "whitespace"),
    ]
    for test, label in bad:
        if test(value):
            return (f"{what} must not contain {label}; allowed: letters, digits, '_', '-', '.' "
                    f"(not first), 1-64 characters; got {value!r}. Fix: e.g. 'smollm2'")
    if not _NAME_RE.fullmatch(value):
        return (f"{what} may use only letters, digits, '_', '-', '.' (not first), 1-64 "
                f"characters; got {value!r}. Fix: e.g. 'smollm2'")
    return None
