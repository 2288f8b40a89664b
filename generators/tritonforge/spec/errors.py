"""The one error type for a bad spec."""

from __future__ import annotations

__all__ = ["SpecError"]


class SpecError(ValueError):
    """A spec is unreadable or invalid. ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid spec {source}" if source else "invalid spec"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))
