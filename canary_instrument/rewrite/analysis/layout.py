"""Lay out generated statements the way a human (or black) would: one line when it fits, else split.

Text is produced at column 0 with the target file's own indentation unit; libcst adds the
block's indentation when the statement is placed.
"""

from __future__ import annotations

import ast

MIN_LIMIT = 79
MAX_LIMIT = 120


def line_limit(text: str) -> int:
    """The file's own line length: its longest line, clamped to [79, 120].

    Generated lines never exceed it, so applying to an already wired file computes the same
    limit (apply stays idempotent).
    """
    longest = max((width(line) for line in text.splitlines()), default=0)
    return max(MIN_LIMIT, min(MAX_LIMIT, longest))


def width(line: str) -> int:
    return len(line.expandtabs(4))


def fit(statement: str, indent: str, unit: str, limit: int) -> str:
    """`statement` (one line) split like black when `indent + statement` exceeds `limit`.

    Returns lines joined by "\\n", the first at column 0, continuation lines indented by `unit`.
    """
    if width(indent + statement) <= limit:
        return statement
    node = ast.parse(statement).body[0]
    if isinstance(node, ast.Assign):
        prefix = " = ".join(ast.get_source_segment(statement, t) for t in node.targets) + " = "
        value = node.value
    elif isinstance(node, ast.Return):
        prefix, value = "return ", node.value
    elif isinstance(node, ast.Expr):
        prefix, value = "", node.value
    else:
        return statement
    segment = lambda n: ast.get_source_segment(statement, n)  # noqa: E731
    inner = indent + unit
    if isinstance(value, ast.Call):
        head = f"{prefix}{segment(value.func)}("
        args = [segment(a) for a in value.args] + [segment(k) for k in value.keywords]
        joined = ", ".join(args)
        if width(inner + joined) <= limit:
            return f"{head}\n{unit}{joined}\n)"
        return head + "\n" + "".join(f"{unit}{arg},\n" for arg in args) + ")"
    if isinstance(value, ast.IfExp):
        return (
            f"{prefix}(\n{unit}{segment(value.body)}\n{unit}if {segment(value.test)}\n"
            f"{unit}else {segment(value.orelse)}\n)"
        )
    return statement


def indent_lines(text: str, unit: str) -> str:
    return "\n".join(unit + line if line else line for line in text.split("\n"))
