"""Reading the process tree from Linux's /proc (tests and benchmarks use it to find every
process of a server: stubs, vLLM's engine core and workers)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["descendants"]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc's parent links); [] where /proc is absent."""
    children: dict[int, list[int]] = {}
    root = Path("/proc")
    for entry in root.iterdir() if root.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
