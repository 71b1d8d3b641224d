"""Statement blocks: the lists nested in compound statements, walked parents first with their loops."""

from __future__ import annotations

import ast

from canary_instrument.rewrite.syntax.nodes import SCOPE_TYPES, walk


_BLOCK_FIELDS: dict[type, tuple[tuple[str, ...], bool, bool]] = {}  # per node type: block fields, handlers, cases


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in a compound statement."""
    kind = type(stmt)
    shape = _BLOCK_FIELDS.get(kind)
    if shape is None:
        fields = getattr(kind, "_fields", ())
        shape = _BLOCK_FIELDS[kind] = (
            tuple(name for name in ("body", "orelse", "finalbody") if name in fields),
            "handlers" in fields,
            "cases" in fields,
        )
    names, handlers, cases = shape
    if not names and not handlers and not cases:
        return []  # a simple statement (most of them): nothing to look up
    blocks = []
    for name in names:
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    if handlers:
        for handler in stmt.handlers:
            blocks.append(handler.body)
    if cases:
        for case in stmt.cases:
            blocks.append(case.body)
    return blocks


_FOR_TYPES = frozenset((ast.For, ast.AsyncFor))


def walk_blocks(block, loops=(), owner=None):
    """Yield (block, owner statement, enclosing for-loops) for a block and every block nested in it,
    parents first, in source order."""
    stack = [(block, owner, loops)]
    while stack:
        block, owner, loops = stack.pop()
        yield block, owner, loops
        nested = []
        for stmt in block:
            kind = type(stmt)
            if kind in SCOPE_TYPES:
                continue
            children = child_blocks(stmt)
            if children:
                inner_loops = loops + (stmt,) if kind in _FOR_TYPES else loops
                nested.extend((child, stmt, inner_loops) for child in children)
        stack.extend(reversed(nested))


def block_of(function, stmt) -> list[ast.stmt] | None:
    for block, _, _ in walk_blocks(function.body):
        if any(s is stmt for s in block):
            return block
    return None


def top_statement(function, node) -> ast.stmt | None:
    """The statement of `function.body` (top level) that holds `node`."""
    for stmt in function.body:
        if any(child is node for child in walk(stmt)):
            return stmt
    return None


def loop_index(loops) -> str | None:
    for loop in reversed(loops):
        if isinstance(loop.target, ast.Name):
            return loop.target.id
    return None
