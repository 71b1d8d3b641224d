"""Map lines of generated kernels back to their template lines (footer written by render.py)."""

from __future__ import annotations

import json
import traceback
from functools import lru_cache
from pathlib import Path

from .render import LINE_MAP_PREFIX


@lru_cache(maxsize=64)
def _runs(path: str) -> tuple[str, tuple[tuple[int, int, int], ...]] | None:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines[-3:]):
        if line.startswith(LINE_MAP_PREFIX):
            data = json.loads(line[len(LINE_MAP_PREFIX):])
            return data["template"], tuple(tuple(r) for r in data["runs"])
    return None


def template_location(generated_path: str, line: int) -> str | None:
    """``templates/NAME:LINE`` for a line of a generated kernel file, or None if not generated."""
    found = _runs(str(generated_path))
    if found is None:
        return None
    template, runs = found
    best = None
    for gen, src, count in runs:
        if gen <= line < gen + count:
            return f"templates/{template}:{src + line - gen}"
        if gen <= line:
            best = src + count - 1  # a line with no marker inherits the previous source line
    return f"templates/{template}:{best}" if best is not None else None


def _compilation_lines(exc: BaseException, generated_files: list[str]):
    """Triton CompilationError: locate the failing function's source inside a generated file."""
    src, node = getattr(exc, "src", None), getattr(exc, "node", None)
    if not src or not hasattr(node, "lineno"):
        return
    for path in generated_files:
        text = Path(path).read_text(encoding="utf-8")
        at = text.find(src)
        if at >= 0:
            yield path, text.count("\n", 0, at) + node.lineno


def _chain(exc: BaseException):
    """The exception and its causes (Triton's interpreter and compiler wrap the original error)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def annotate(exc: BaseException, generated_files: list[str]) -> BaseException:
    """Add a note naming the template line behind every generated-kernel line in ``exc``."""
    notes = []
    generated = {str(Path(p).resolve()) for p in generated_files}
    for link in _chain(exc):
        for frame in traceback.extract_tb(link.__traceback__):
            if str(Path(frame.filename).resolve()) in generated:
                where = template_location(frame.filename, frame.lineno)
                if where:
                    notes.append(f"{Path(frame.filename).name}:{frame.lineno} is generated from {where}")
        for path, line in _compilation_lines(link, generated_files):
            where = template_location(path, line)
            if where:
                notes.append(f"{Path(path).name}:{line} is generated from {where}")
    for note in dict.fromkeys(notes):
        exc.add_note(note)
    return exc
