"""Reading a spec: YAML -> pydantic -> cross-field rules, with one message per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tritonforge.spec.errors import SpecError
from tritonforge.spec.model import Spec
from tritonforge.spec.rules import check_spec

__all__ = ["format_validation_error", "load_spec", "parse_spec"]

_MAX_SPEC_BYTES = 1_048_576


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (YAML would keep the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode,
                       deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _fields_at(loc: tuple[int | str, ...]) -> list[str] | None:
    """Field names of the section at ``loc`` (for 'unknown key' messages)."""
    model: type[BaseModel] = Spec
    for part in loc:
        if not isinstance(part, str) or part not in model.model_fields:
            return None
        ann = model.model_fields[part].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return list(model.model_fields)


def format_validation_error(exc: ValidationError) -> list[str]:
    """One line per pydantic error: ``path: problem; got value. Fix: ...``."""
    out: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in loc)
        path = path.replace(".[", "[") or "(spec)"
        kind = err["type"]
        got = err.get("input")
        if kind == "extra_forbidden":
            allowed = _fields_at(loc[:-1]) or []
            out.append(f"{path}: unknown key; allowed here: {', '.join(allowed)}. "
                       "Fix: remove it or check the spelling")
        elif kind == "value_error":
            out.append(f"{path}: {err['ctx']['error']}")
        elif kind == "missing":
            out.append(f"{path}: required; got nothing. Fix: add it")
        else:
            shown = repr(got)
            if len(shown) > 120:
                shown = shown[:117] + "..."
            out.append(f"{path}: {err['msg']}; got {shown}. Fix: give an allowed value")
    return out


def parse_spec(data: Any, source: str = "") -> Spec:
    """Validate already-parsed YAML ``data``; raise ``SpecError`` listing every problem."""
    if not isinstance(data, dict):
        raise SpecError([(f"(spec): the top level must be a mapping with at least 'name'; got "
                         f"{type(data).__name__}. Fix: start the file with 'name: my-model'")],
                        source)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc), source) from None
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def load_spec(path: str | Path) -> Spec:
    """Read a YAML spec file; raise ``SpecError`` (never another exception) when it is bad."""
    p = Path(path)
    src = str(p)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError([(f"(file): cannot read the spec: {exc.strerror or exc}. "
                         "Fix: check the path")], src) from None
    if len(raw) > _MAX_SPEC_BYTES:
        raise SpecError([(f"(file): the spec is larger than {_MAX_SPEC_BYTES} bytes. "
                         "Fix: is this the right file?")], src)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(["(file): the spec is not UTF-8 text. Fix: save it as UTF-8"],
                        src) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        detail = str(exc).replace("\n", " ")
        raise SpecError([f"(yaml): not valid YAML: {detail}. Fix: correct the syntax"],
                        src) from None
    return parse_spec(data, src)
