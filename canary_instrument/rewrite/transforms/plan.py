"""What a transform wants changed in one file, keyed by statement positions from the ast analysis.

Libcst-free on purpose: planning a file that needs no change (a no-op apply in a pre-commit
hook) never imports libcst.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

Key = tuple[int, int]  # 1-based line, 0-based column of a statement's first character


def key_of(node: ast.AST, lines: list[str]) -> Key:
    """The libcst position of an ast statement (ast columns count UTF-8 bytes, libcst characters)."""
    line = lines[node.lineno - 1] if node.lineno - 1 < len(lines) else ""
    column = len(line.encode("utf-8")[: node.col_offset].decode("utf-8", "replace"))
    return node.lineno, column


@dataclass
class EditPlan:
    """What to change in one file; statement texts are at column 0 with "\\n" newlines."""

    replace_value: dict[Key, str] = field(default_factory=dict)  # Assign -> new value (from a statement text)
    replace_statement: dict[Key, str] = field(default_factory=dict)  # statement -> statement (comments above kept)
    insert_before: dict[Key, list[str]] = field(default_factory=dict)
    insert_after: dict[Key, list[str]] = field(default_factory=dict)
    # inserted above the statement's own blank lines and comments (a hook: revert takes it out alone)
    insert_above: dict[Key, list[str]] = field(default_factory=dict)
    wrap: dict[Key, tuple[Key, str, str]] = field(default_factory=dict)  # first -> (last, assignment, with header)
    add_item: dict[Key, tuple[str, str]] = field(default_factory=dict)  # With -> (name, "first" | "last")
    remove: set[Key] = field(default_factory=set)
    append_to_class: dict[Key, list[str]] = field(default_factory=dict)
    add_imports: list[tuple[str, str | None]] = field(default_factory=list)  # (module, name or None)
    # (module, name or None, local alias or None), removed only where nothing uses it any more
    remove_imports: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    # (module, name): from-imports removed even where the name is still read (the runtime's import of
    # the same name replaces them, e.g. upstream's own `install_canary` once its hook is migrated)
    drop_imports: list[tuple[str, str]] = field(default_factory=list)
    # (module, names): the runtime import, placed in the file's third-party import block as isort would
    runtime_import: tuple[str, tuple[str, ...]] | None = None
    own_packages: frozenset[str] = frozenset()  # top-level names that are the file's own package (first party)
    touched: int = 0  # sites and hooks this plan changes (for the summary line)

    def __bool__(self) -> bool:
        return any(
            (self.replace_value, self.replace_statement, self.insert_before, self.insert_after, self.insert_above,
             self.wrap, self.add_item, self.remove,
             self.append_to_class, self.add_imports, self.remove_imports, self.drop_imports)
        )


class PlanNotApplied(RuntimeError):
    """The plan named a statement that the libcst tree does not have (an internal error)."""
