"""Escaping filters: every user-supplied string reaches a generated file only through these.

* ``pbtxt_string`` -- a complete double-quoted protobuf text-format string literal.
* ``json_text`` -- deterministic JSON (sorted keys) for JSON-valued parameters and files.
* ``sh_quote`` -- one shell word for the generated scripts.

All three also make sure no template marker (``${``, ``{{``, ``{%``, ``{#``) can appear in
the output, even when the user's value contains one: the parsed value is unchanged, but the
raw file never looks like an unfilled template (``tritonforge validate`` rejects those).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["MARKER_RE", "json_text", "pbtxt_string", "sh_quote"]

# What an unfilled template placeholder looks like in a generated file.
MARKER_RE: Final = re.compile(r"\$\{|\{\{|\{%|\{#")
_AFTER_BRACE: Final = re.compile(r"(?<=\{)([{%#])")

_PBTXT_SIMPLE: Final = {"\\": "\\\\", '"': '\\"', "'": "\\'", "\n": "\\n", "\r": "\\r",
                        "\t": "\\t"}


def pbtxt_string(value: object) -> str:
    """``value`` (converted with ``str``) as a quoted protobuf text-format string.

    Control characters become octal escapes, ``$`` always and a ``{``/``%``/``#`` after a
    ``{`` become octal escapes too, so the raw text never contains a template marker.
    """
    text = str(value)
    out: list[str] = []
    prev = ""
    for ch in text:
        if ch in _PBTXT_SIMPLE:
            out.append(_PBTXT_SIMPLE[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or ch == "$" or (prev == "{" and ch in "{%#"):
            for byte in ch.encode("utf-8"):
                out.append(f"\\{byte:03o}")
        else:
            out.append(ch)
        prev = ch
    return '"' + "".join(out) + '"'


def json_text(value: Any, *, indent: int | None = None) -> str:
    """Deterministic JSON of ``value`` with keys sorted; markers escaped as ``\\uXXXX``.

    ``$`` can only occur inside JSON strings, and ``{`` followed by ``{``/``%``/``#`` only
    inside strings too (structural braces are followed by ``"`` or ``}``), so escaping
    those characters wherever they occur keeps the JSON value identical.
    """
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, indent=indent,
                      separators=(",", ": ") if indent is not None else (", ", ": "),
                      allow_nan=False)
    text = text.replace("$", "\\u0024")
    return _AFTER_BRACE.sub(lambda m: f"\\u{ord(m.group(1)):04x}", text)


_SH_SAFE: Final = re.compile(r"[A-Za-z0-9_./:=@%+,-]+")


def sh_quote(value: object) -> str:
    """``value`` as one POSIX/bash shell word.

    Plain words stay as they are; others are single-quoted, or ANSI-C quoted
    (``$'...'``, bash) when they contain a quote, a control character, ``$`` or braces.
    """
    text = str(value)
    if text and _SH_SAFE.fullmatch(text):
        return text
    if not any(c in text for c in "'${}%#") and all(ord(c) >= 0x20 for c in text):
        return "'" + text + "'"
    out: list[str] = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or ch in "${}%#":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"
