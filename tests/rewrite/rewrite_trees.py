"""Small source trees written from strings, for rewriter tests in libcst CodemodTest style."""

from __future__ import annotations

import textwrap
from pathlib import Path

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.check import check_tree
from canary_instrument.rewrite.transforms.revert import revert_tree
from canary_instrument.rewrite.transforms.scaffold import scaffold_tree
from canary_instrument.rewrite.transforms.apply import apply_tree

COMMANDS = {"scaffold": scaffold_tree, "apply": apply_tree, "revert": revert_tree}


class Tree:
    """A temporary source tree: `write` files, `run` a command, `read` the result back."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, files: dict[str, str | bytes]) -> None:
        for rel, text in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text if isinstance(text, bytes) else textwrap.dedent(text).lstrip("\n").encode())

    def read(self, rel: str) -> str:
        return (self.root / rel).read_bytes().decode()

    def run(self, command: str, catalog_file: Path | None = None, write: bool = True):
        catalog = load_catalog(self.root, catalog_file)
        if command == "check":
            return check_tree([self.root], catalog)
        return COMMANDS[command]([self.root], catalog, write=write)

    def codes(self, result) -> list[tuple[str, int]]:
        return [(f.code, f.line) for f in result.findings]


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
