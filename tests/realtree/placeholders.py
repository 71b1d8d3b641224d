"""The placeholder state of a released sglang tree, made independently of the product's code.

Upstream wires every canary site by hand (`NAME = (BODY if <test on canary_manager> else nullcontext())`)
and every hook with a statement that calls into its manager. Turning that back into what a user
who never had the hand-written wiring would write gives the ground truth the real-tree tests
compare against: each conditional becomes `NAME = contextlib.nullcontext()`, each hook statement
goes (with the comment and blank lines directly above it, as a removed statement takes them), and
the imports the change left unused go. It also counts what it replaced: the expected sites and
hooks of the release.

Deliberately simple text edits on `ast` positions; no code of `canary_instrument`.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

NULL_CONTEXTS = ("nullcontext", "empty_context")
HOOK_CALLS = ("install_canary", "mark_init_finished", "attach_radix_cache")


@dataclass
class Expected:
    """What the placeholder state replaced, per file (paths relative to the tree root)."""

    sites: dict[str, list[str]] = field(default_factory=dict)  # file -> placeholder names (in order)
    hooks: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # file -> (hook call, function)

    @property
    def site_count(self) -> int:
        return sum(len(v) for v in self.sites.values())

    @property
    def hook_count(self) -> int:
        return sum(len(v) for v in self.hooks.values())


def _last(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _mentions_manager(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "canary_manager" for n in ast.walk(node))


def _is_site(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    value = stmt.value
    return (
        isinstance(value, ast.IfExp) and isinstance(value.orelse, ast.Call) and not value.orelse.args
        and _last(value.orelse.func) in NULL_CONTEXTS and _mentions_manager(value.test)
    )


def _hook_call(stmt: ast.stmt) -> str | None:
    """The canary call a hook statement makes: an install assignment, or an `if` on the manager calling it."""
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and _last(stmt.value.func) == "install_canary":
        if any(isinstance(t, ast.Attribute) and t.attr == "canary_manager" for t in stmt.targets):
            return "install_canary"
    if isinstance(stmt, ast.If) and not stmt.orelse and _mentions_manager(stmt.test) and len(stmt.body) == 1:
        body = stmt.body[0]
        if isinstance(body, ast.Expr) and isinstance(body.value, ast.Call):
            name = _last(body.value.func)
            if name in HOOK_CALLS:
                return name
    return None


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _stdlib_import_line(lines: list[str], tree: ast.Module) -> tuple[int, str]:
    """(0-based line, text) where `import contextlib` goes: isort's place in the standard-library block."""
    stdlib = [
        node for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
        and (node.names[0].name if isinstance(node, ast.Import) else node.module).split(".")[0]
        in sys.stdlib_module_names - {"__future__"}
    ]
    for node in stdlib:
        # isort: plain imports first, then from-imports, each by module name.
        if isinstance(node, ast.ImportFrom) or node.names[0].name > "contextlib":
            return node.lineno - 1, "import contextlib"
    if stdlib:
        return stdlib[-1].end_lineno, "import contextlib"
    raise AssertionError("no standard-library import to put `import contextlib` beside")


def _remove_name(lines: list[str], node: ast.ImportFrom, name: str) -> None:
    """Drop `name` from a from-import (its own line in a parenthesised one, else from the one line)."""
    if len(node.names) == 1:
        start = node.lineno - 1
        for index in range(start, node.end_lineno):
            lines[index] = None
        return
    if node.end_lineno > node.lineno:
        for index in range(node.lineno, node.end_lineno - 1):
            if lines[index] is not None and lines[index].strip().rstrip(",") == name:
                lines[index] = None
                return
        raise AssertionError(f"cannot drop {name} from a multi-line import at line {node.lineno}")
    line = lines[node.lineno - 1]
    head, _, names = line.partition(" import ")
    kept = [n.strip() for n in names.rstrip("\n").split(",") if n.strip() != name]
    lines[node.lineno - 1] = f"{head} import {', '.join(kept)}\n"


def placeholder_source(text: str) -> tuple[str, list[str], list[tuple[str, str]]]:
    """The placeholder state of one file's text, its site names and its (hook call, function)s."""
    tree = ast.parse(text)
    lines: list[str | None] = text.splitlines(keepends=True)
    sites, hooks = [], []
    read_before = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    removed_reads: set[str] = set()
    edits = []  # (first line, last line, replacement lines) 0-based inclusive
    owner: dict[int, str] = {}
    for function in _functions(tree):  # outer functions first: an inner one overrides for its own nodes
        for node in ast.walk(function):
            owner[id(node)] = function.name
    for node in ast.walk(tree):
        for block_name in ("body", "orelse", "finalbody"):
            block = getattr(node, block_name, None)
            if not isinstance(block, list) or id(node) not in owner:
                continue
            for index, stmt in enumerate(block):
                if not isinstance(stmt, ast.stmt):
                    continue
                if _is_site(stmt):
                    name = stmt.targets[0].id
                    sites.append(name)
                    removed_reads |= {n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)}
                    indent = lines[stmt.lineno - 1][: stmt.col_offset]
                    edits.append((stmt.lineno - 1, stmt.end_lineno - 1, [f"{indent}{name} = contextlib.nullcontext()\n"]))
                    continue
                call = _hook_call(stmt)
                if call is None:
                    continue
                hooks.append((call, owner[id(stmt)]))
                removed_reads |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
                first = stmt.lineno - 1
                floor = block[index - 1].end_lineno if index else first
                while first - 1 >= floor and (not lines[first - 1].strip() or lines[first - 1].lstrip().startswith("#")):
                    first -= 1
                edits.append((first, stmt.end_lineno - 1, []))
    if not sites and not hooks:
        return text, [], []
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first : last + 1] = replacement
    new = "".join(lines)
    tree = ast.parse(new)
    lines = new.splitlines(keepends=True)
    read_after = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    # Imports the change left unused: names the removed code read that nothing reads any more.
    unused = (removed_reads & read_before) - read_after - {"contextlib"}
    for node in reversed(tree.body):
        if isinstance(node, ast.ImportFrom) and not node.level:
            for alias in list(node.names):
                if (alias.asname or alias.name) in unused:
                    _remove_name(lines, node, alias.asname or alias.name)
                    node.names.remove(alias)
    lines = [line for line in lines if line is not None]
    new = "".join(lines)
    if sites and "contextlib" not in {
        a.asname or a.name for n in ast.parse(new).body if isinstance(n, ast.Import) for a in n.names
    }:
        tree = ast.parse(new)
        lines = new.splitlines(keepends=True)
        at, statement = _stdlib_import_line(lines, tree)
        lines.insert(at, statement + "\n")
        new = "".join(lines)
    return new, sites, hooks


def make_placeholder_tree(root: Path) -> Expected:
    """Rewrite every hand-wired file under `root` in place (upstream's own `kv_canary` package untouched)."""
    expected = Expected()
    for path in sorted(root.rglob("*.py")):
        if "kv_canary" in path.parts:
            continue
        data = path.read_bytes()
        if b"canary_manager" not in data:
            continue
        new, sites, hooks = placeholder_source(data.decode())
        rel = path.relative_to(root).as_posix()
        if sites:
            expected.sites[rel] = sites
        if hooks:
            expected.hooks[rel] = hooks
        if new != data.decode():
            path.write_bytes(new.encode())
    return expected
