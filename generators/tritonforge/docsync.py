"""Generated sections of the docs: each is the text between two markers in a Markdown file,
rewritten from its one source (the request-parameter table, the spec schema).

``python -m tritonforge.docsync --write`` rewrites them all; ``--check`` (and the tests)
fail while any is stale.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["SECTIONS", "Section", "stale_sections"]

ROOT: Final = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Section:
    """One generated block: where it lives, its markers, and what renders its body."""

    path: str  # relative to the repository root
    name: str  # the marker's name: <!-- NAME:begin (...) --> ... <!-- NAME:end -->
    source: str  # what it is generated from, said in the begin marker
    render: Callable[[], str]

    @property
    def begin(self) -> str:
        return f"<!-- {self.name}:begin (generated from {self.source}; do not edit) -->"

    @property
    def end(self) -> str:
        return f"<!-- {self.name}:end -->"

    def replace(self, document: str) -> str:
        """``document`` with the text between the markers replaced by the current body."""
        head, found, rest = document.partition(self.begin)
        if not found or self.end not in rest:
            raise ValueError(f"{self.path}: markers {self.begin!r} … {self.end!r} not found")
        _, _, tail = rest.partition(self.end)
        return f"{head}{self.begin}\n\n{self.render()}\n{self.end}{tail}"


def _requests() -> str:
    from tritonforge.contract import requests_markdown

    return requests_markdown()


def _spec_reference() -> str:
    from tritonforge.spec.reference import reference_markdown

    return reference_markdown()


SECTIONS: Final = (
    Section("docs/requests.md", "request-parameters", "tritonforge.contract", _requests),
    Section("docs/generator.md", "spec-reference", "the schema", _spec_reference),
)


def stale_sections(root: Path = ROOT) -> list[str]:
    """The paths whose generated section differs from what its source renders now."""
    stale = []
    for s in SECTIONS:
        text = (root / s.path).read_text()
        if s.replace(text) != text:
            stale.append(s.path)
    return stale


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for s in SECTIONS:
            target = ROOT / s.path
            target.write_text(s.replace(target.read_text()))
        return 0
    if argv == ["--check"]:
        stale = stale_sections()
        for path in stale:
            sys.stderr.write(f"{path} is stale: python -m tritonforge.docsync --write\n")
        return 1 if stale else 0
    sys.stderr.write("usage: python -m tritonforge.docsync --write | --check\n")
    return 2


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    raise SystemExit(main(sys.argv[1:]))
