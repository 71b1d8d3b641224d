"""Map dotted module names a file imports to the tree's files that define them.

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
