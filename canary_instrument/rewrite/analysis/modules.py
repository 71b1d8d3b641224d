"""Map dotted module names a file imports to the tree's files that define them, and score how well one names a file.

Suffix matching on the discovered paths: an absolute import names the module from its top-level
package, so the file is the one whose path ends in that package path, wherever the tree is rooted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable


def module_files(modules: Iterable[str], files: Iterable[Path]) -> list[Path]:
    """The files among `files` that define one of `modules` (`a.b.c`: `.../a/b/c.py` or `.../a/b/c/__init__.py`)."""
    suffixes = set()
    for module in modules:
        parts = [p for p in module.split(".") if p]
        if parts:
            suffixes.add("/" + "/".join(parts) + ".py")
            suffixes.add("/" + "/".join(parts) + "/__init__.py")
    if not suffixes:
        return []
    return [path for path in files if any(("/" + path.as_posix()).endswith(s) for s in suffixes)]


def module_score(module: list[str], file_module: list[str]) -> int:
    """How well an import's module path names a file: the length of their common dotted suffix
    (`sglang.srt.a.b` names `.../srt/a/b.py` by `srt.a.b`), or of the package for a re-export."""
    score = _common_suffix(module, file_module)
    if score:
        return score * 2
    # `from pkg import Name` where pkg/__init__.py re-exports Name from pkg/mod.py.
    return max(0, _common_suffix(module, file_module[:-1]) * 2 - 1)


def _common_suffix(first: list[str], second: list[str]) -> int:
    count = 0
    for a, b in zip(reversed(first), reversed(second)):
        if a != b:
            break
        count += 1
    return count
