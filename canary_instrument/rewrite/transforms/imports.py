"""Where an added import goes and what spacing an edit of the import block keeps, as isort would write it.

libcst's `AddImportsVisitor` adds the imports (and merges a name into an existing import from its
module); it puts a new statement after the file's last top-level import, which in sglang's files is the
first-party block, where isort and ruff's `I001` would not have it. On sglang 0.5.23's
`model_executor/model_runner.py`, AddImportsVisitor alone writes the runtime import after
`from sglang.srt.utils.weight_checker import WeightChecker` (line 261); apply writes it after
`import torch.distributed as dist` (line 26), at the end of the third-party block. So the statements
it inserted are moved: a plain standard-library import among the standard-library imports
(`place_stdlib_imports`), the runtime import into the third-party block, sorted there
(`add_sorted_import`). The file keeps its own spacing around its imports, so that revert (which removes
what apply added) gives back the input byte for byte.
"""

from __future__ import annotations

import sys

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node


def keep_spacing(before: cst.Module, after: cst.Module) -> tuple[list, set[int]]:
    """Undo the blank line AddImportsVisitor puts before the first statement after the imports.

    The file keeps its own spacing, and revert (which removes the import) gives back the
    input byte for byte. Returns the body and the indices of the inserted statements.
    """
    count = len(after.body) - len(before.body)
    body = list(after.body)
    inserted = set()
    old = 0
    for new in range(len(body)):
        original = before.body[old] if old < len(before.body) else None
        if original is not None and (body[new] is original or body[new].deep_equals(original)):
            old += 1
        elif original is not None and body[new].with_changes(leading_lines=original.leading_lines).deep_equals(original):
            body[new] = original
            old += 1
        elif len(inserted) < count:
            inserted.add(new)
        else:  # an existing import that gained names
            old += 1
    return body, inserted


def _module_of(statement) -> tuple[str, bool] | None:
    """(top-level module, is a plain `import`) of a one-import statement line, else None."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    node = statement.body[0]
    if isinstance(node, cst.Import) and len(node.names) == 1:
        return get_full_name_for_node(node.names[0].name).split(".")[0], True
    if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
        return get_full_name_for_node(node.module).split(".")[0], False
    return None


def place_stdlib_imports(body: list, inserted: set[int]) -> list:
    """Move an added `import <stdlib module>` to where isort would put it among the standard-library imports.

    It goes before the first standard-library import that sorts after it (taking over that
    statement's leading blank lines, which revert hands back), else after the last one.
    """
    for index in sorted(inserted, reverse=True):
        described = _module_of(body[index])
        if described is None or not described[1] or described[0] not in sys.stdlib_module_names:
            continue
        name = described[0]
        statement = body.pop(index)
        stdlib = [
            (i, info) for i, node in enumerate(body)
            if i not in inserted and (info := _module_of(node)) is not None
            and info[0] in sys.stdlib_module_names and info[0] != "__future__"
        ]
        later = next((i for i, (module, plain) in stdlib if not plain or module > name), None)
        if later is not None:
            body.insert(later, statement.with_changes(leading_lines=body[later].leading_lines))
            body[later + 1] = body[later + 1].with_changes(leading_lines=())
        elif stdlib:
            body.insert(stdlib[-1][0] + 1, statement)
        else:
            body.insert(index, statement)
    return body


def hand_over_spacing(before: cst.Module, after: cst.Module) -> cst.Module:
    """Give a removed import's leading lines to the statement after it (undoes place_stdlib_imports)."""
    body = list(after.body)
    removed = len(before.body) - len(body)
    new = 0
    for original in before.body:
        if new < len(body) and body[new].deep_equals(original):
            new += 1
        elif removed > 0 and _module_of(original) is not None:
            removed -= 1
            if new < len(body) and original.leading_lines and not body[new].leading_lines:
                body[new] = body[new].with_changes(leading_lines=original.leading_lines)
        else:
            new += 1
    return after.with_changes(body=body)


# isort's sections, in file order.
_SECTIONS = ("future", "stdlib", "thirdparty", "firstparty", "local")


def _docstring(statement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.BaseString)
    )


def _import_of(statement) -> cst.Import | cst.ImportFrom | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(
        statement.body[0], (cst.Import, cst.ImportFrom)
    ):
        return statement.body[0]
    return None


def _section(node, own: frozenset[str]) -> str:
    if isinstance(node, cst.ImportFrom) and node.relative:
        return "local"
    name = get_full_name_for_node(node.module if isinstance(node, cst.ImportFrom) else node.names[0].name) or ""
    top = name.split(".")[0]
    if top == "__future__":
        return "future"
    if top in sys.stdlib_module_names:
        return "stdlib"
    return "firstparty" if top in own else "thirdparty"


def _sort_key(node) -> tuple[bool, str]:
    """isort's default order inside a section: plain imports first, then from-imports, by module name."""
    if isinstance(node, cst.ImportFrom):
        return True, (get_full_name_for_node(node.module) or "").lower()
    return False, (get_full_name_for_node(node.names[0].name) or "").lower()


def _blank(lines) -> bool:
    return any(line.comment is None for line in lines)


def add_sorted_import(module: cst.Module, name: str, names: tuple[str, ...], own: frozenset[str]) -> cst.Module:
    """`from <name> import <names>` where isort would put it: in the file's third-party block, sorted there.

    An existing import from the module gains the names instead. A file without a third-party
    block gets a new one after its standard-library block (a blank line on each side), as isort
    would write it.
    """
    body = list(module.body)
    for statement in body:
        node = _import_of(statement)
        if isinstance(node, cst.ImportFrom) and not node.relative and get_full_name_for_node(node.module) == name:
            context = CodemodContext()
            for imported in names:
                AddImportsVisitor.add_needed_import(context, name, imported)
            return _keep_spacing_module(module, module.visit(AddImportsVisitor(context)))
    start = 1 if body and _docstring(body[0]) else 0
    end = start
    while end < len(body) and _import_of(body[end]) is not None:
        end += 1
    if end == start:
        context = CodemodContext()
        for imported in names:
            AddImportsVisitor.add_needed_import(context, name, imported)
        return _keep_spacing_module(module, module.visit(AddImportsVisitor(context)))
    statement = cst.parse_statement(
        f"from {name} import {', '.join(names)}{module.default_newline}", config=module.config_for_parsing
    )
    if len(statement.body[0].names) and len(module.code_for_node(statement).rstrip()) > 88:
        inner = "".join(f"    {imported},{module.default_newline}" for imported in names)
        statement = cst.parse_statement(
            f"from {name} import ({module.default_newline}{inner}){module.default_newline}",
            config=module.config_for_parsing,
        )
    # Blocks of the import region: a blank line starts a new one.
    blocks: list[list[int]] = []
    for index in range(start, end):
        if not blocks or _blank(body[index].leading_lines):
            blocks.append([])
        blocks[-1].append(index)
    section = {index: _section(_import_of(body[index]), own) for index in range(start, end)}
    mine = (True, name.lower())
    third = [block for block in blocks if all(section[i] == "thirdparty" for i in block)]
    if third:
        block = third[0]
        later = next((i for i in block if _sort_key(_import_of(body[i])) > mine), None)
        if later is None:
            body.insert(block[-1] + 1, statement)
        else:
            body.insert(later, statement.with_changes(leading_lines=body[later].leading_lines))
            body[later + 1] = body[later + 1].with_changes(leading_lines=())
        return module.with_changes(body=body)
    rank = _SECTIONS.index("thirdparty")
    before = [block for block in blocks if max(_SECTIONS.index(section[i]) for i in block) < rank]
    if before:
        position = before[-1][-1] + 1
        body.insert(position, statement.with_changes(leading_lines=[cst.EmptyLine()]))
        if position + 1 < len(body) and not _blank(body[position + 1].leading_lines):
            body[position + 1] = body[position + 1].with_changes(
                leading_lines=[cst.EmptyLine(), *body[position + 1].leading_lines]
            )
        return module.with_changes(body=body)
    first = blocks[0][0]
    body.insert(first, statement.with_changes(leading_lines=body[first].leading_lines))
    body[first + 1] = body[first + 1].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=body)


def _keep_spacing_module(before: cst.Module, after: cst.Module) -> cst.Module:
    body, _ = keep_spacing(before, after)
    return after.with_changes(body=body)
