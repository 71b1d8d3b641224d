"""Map dotted module names a file imports to the tree's files that define them, and score how well one names a file.

Suffix matching on the discovered paths: an absolute import names the module from its top-level
package, so the file is the one whose path ends in that package path, wherever the tree is rooted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def module_files(modules: Iterable[str], files: Iterable[Path]) -> list[Path]:
    """The files among `files` that define one of `modules` (`a.b.c`: `.../a/b/c.py` or `.../a/b/c/__init__.py`)."""
    files = list(files)
    return [files[i] for i in ModuleIndex([path.as_posix() for path in files]).indexes(modules)]


class ModuleIndex:
    """The files of a list of path strings by the modules they define (`a.b.c`: `.../a/b/c.py` or
    `.../a/b/c/__init__.py`), without a Path per file: indexed by file name, only the few files of that
    name are compared."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.by_name: dict[str, list[int]] = {}
        for index, key in enumerate(keys):
            self.by_name.setdefault(os.path.basename(key), []).append(index)

    def files(self, modules: Iterable[str]) -> list[str]:
        """The files defining one of `modules`, in the order of the keys."""
        return [self.keys[index] for index in self.indexes(modules)]

    def indexes(self, modules: Iterable[str]) -> list[int]:
        """The positions in the keys of the files defining one of `modules`, in order."""
        found: set[int] = set()
        for module in modules:
            parts = [p for p in module.split(".") if p]
            if not parts:
                continue
            path = "/" + "/".join(parts)
            for name, suffix in ((parts[-1] + ".py", path + ".py"), ("__init__.py", path + "/__init__.py")):
                for index in self.by_name.get(name, ()):
                    if ("/" + _posix(self.keys[index])).endswith(suffix):
                        found.add(index)
        return sorted(found)


def _posix(key: str) -> str:
    return key if os.sep == "/" else Path(key).as_posix()


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
