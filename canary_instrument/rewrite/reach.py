"""Uncovered forward paths (check's CI301): forward calls in classes that no catalogued site covers."""

from __future__ import annotations

import ast

from canary_instrument.catalog import Catalog, call_matches
from canary_instrument.rewrite.locate import FileAnalysis, Uncovered, dotted_name


def find_uncovered(result: FileAnalysis, classes, catalog: Catalog) -> None:
    if not catalog.triggers:
        return
    covered = {id(match.class_node) for match in result.sites}
    for cls in classes:
        if id(cls) in covered:
            continue
        stack = list(cls.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.ClassDef):
                continue  # a nested class is checked on its own
            if isinstance(node, ast.Call) and (name := dotted_name(node.func)) is not None:
                for trigger in catalog.triggers:
                    if any(call_matches(name, p) for p in trigger.calls):
                        result.uncovered.append(Uncovered(node, name, trigger.what, cls.name))
                        break
            stack.extend(ast.iter_child_nodes(node))
    result.uncovered.sort(key=lambda u: (u.call.lineno, u.call.col_offset))
