"""The spec reference in Markdown, generated from the schema's field docstrings.

``docs/generator.md`` embeds this text between two markers (tritonforge.docsync); a test
keeps them equal. Regenerate with ``python -m tritonforge.docsync --write``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tritonforge.spec.model import Spec

__all__ = ["reference_markdown"]



def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("NoneType", "null")
    return text.replace("<class '", "").replace("'>", "").replace("Literal", "one of ")


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return "`" + json.dumps(value) + "`"


def _section(model: type[BaseModel], path: str, out: list[str]) -> None:
    title = path or "top level"
    out.append(f"### `{title}`\n")
    if model.__doc__:
        out.append(model.__doc__.strip().splitlines()[0] + "\n")
    out.append("| field | type | default | description |")
    out.append("|---|---|---|---|")
    nested: list[tuple[type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        full = f"{path}.{name}" if path else name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((ann, full))
            kind = "section"
        else:
            kind = _type_name(ann)
        doc = " ".join((field.description or "").split()).replace("|", "\\|").replace("``", "`")
        out.append(f"| `{full}` | {kind.replace('|', 'or')} | {_default(field)} | {doc} |")
    out.append("")
    for sub, sub_path in nested:
        _section(sub, sub_path, out)


def reference_markdown() -> str:
    out: list[str] = []
    _section(Spec, "", out)
    return "\n".join(out).rstrip() + "\n"
