"""Apply a plan of statement-level edits to a libcst tree, locating nodes by the positions `locate` found.

Scaffold, apply and revert only decide *what* changes (an EditPlan, rewrite/plan.py); this
module is the single place that changes libcst nodes, so every byte outside an edited
statement is reproduced as it was. It is imported only when a plan has work to do.
"""

from __future__ import annotations

import ast
import re
import sys

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider

from canary_instrument.rewrite.plan import EditPlan, Key, PlanNotApplied


class _Editor(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, plan: EditPlan, module: cst.Module) -> None:
        super().__init__()
        self.plan = plan
        self.module = module
        self.config = module.config_for_parsing
        self.newline = module.default_newline
        self.applied: set[Key] = set()

    def _key(self, node: cst.CSTNode) -> Key:
        start = self.get_metadata(PositionProvider, node).start
        return start.line, start.column

    def _statement(self, text: str) -> cst.BaseStatement:
        return cst.parse_statement(text.replace("\n", self.newline) + self.newline, config=self.config)

    def leave_SimpleStatementLine(self, original, updated):
        key = self._key(original)
        text = self.plan.replace_value.get(key)
        if text is None or not isinstance(updated.body[0], cst.Assign):
            return updated
        self.applied.add(key)
        value = self._statement(text).body[0].value
        return updated.with_changes(body=[updated.body[0].with_changes(value=value), *updated.body[1:]])

    def leave_With(self, original, updated):
        key = self._key(original)
        if key not in self.plan.add_item:
            return updated
        self.applied.add(key)
        name, position = self.plan.add_item[key]
        items = list(updated.items)
        new = cst.WithItem(item=cst.Name(name))
        if position == "first":
            comma = items[0].comma if len(items) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            if len(items) == 1 and updated.lpar is not cst.MaybeSentinel.DEFAULT and isinstance(
                updated.lpar.whitespace_after, cst.ParenthesizedWhitespace
            ):
                comma = cst.Comma(whitespace_after=updated.lpar.whitespace_after)
            items.insert(0, new.with_changes(comma=comma))
        else:
            last = items[-1]
            between = items[-2].comma if len(items) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            items[-1] = last.with_changes(comma=between)
            items.append(new.with_changes(comma=last.comma))
        return updated.with_changes(items=items)

    def leave_ClassDef(self, original, updated):
        key = self._key(original)
        texts = self.plan.append_to_class.get(key)
        if not texts or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        self.applied.add(key)
        added = []
        for text in texts:
            statement = self._statement(text)
            added.append(statement.with_changes(leading_lines=[cst.EmptyLine(indent=False), *statement.leading_lines]))
        return updated.with_changes(body=updated.body.with_changes(body=[*updated.body.body, *added]))

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._edit_block(original.body, updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._edit_block(original.body, updated.body))

    def _edit_block(self, originals, updates):
        plan = self.plan
        keys = [self._key(node) for node in originals]
        result = []
        index = 0
        while index < len(updates):
            key, node = keys[index], updates[index]
            if key in plan.remove:
                self.applied.add(key)
                index += 1
                continue
            if key in plan.replace_statement:
                self.applied.add(key)
                node = self._statement(plan.replace_statement[key]).with_changes(leading_lines=node.leading_lines)
            if key in plan.insert_above:
                self.applied.add(key)
                result.extend(self._statement(text) for text in plan.insert_above[key])
            if key in plan.insert_before:
                self.applied.add(key)
                inserted = [self._statement(text) for text in plan.insert_before[key]]
                # Blank lines and comments above the site stay above the inserted lines.
                inserted[0] = inserted[0].with_changes(leading_lines=node.leading_lines)
                result.extend(inserted)
                node = node.with_changes(leading_lines=())
            if key in plan.wrap:
                self.applied.add(key)
                last, assignment, header = plan.wrap[key]
                end = keys.index(last, index)
                body = list(updates[index + 1 : end + 1])
                first = node
                assign = self._statement(assignment).with_changes(leading_lines=first.leading_lines)
                wrapper = self._statement(header + "\n    pass")
                wrapper = wrapper.with_changes(
                    body=cst.IndentedBlock(body=[first.with_changes(leading_lines=()), *body])
                )
                result.extend([assign, wrapper])
                index = end + 1
                continue
            result.append(node)
            if key in plan.insert_after:
                self.applied.add(key)
                result.extend(self._statement(text) for text in plan.insert_after[key])
            index += 1
        return result


def apply_plan(module: cst.Module, plan: EditPlan) -> cst.Module:
    """The module with the plan applied; raises PlanNotApplied when a planned edit found no node."""
    if not plan:
        return module
    editor = _Editor(plan, module)
    edited = MetadataWrapper(module, unsafe_skip_copy=True).visit(editor)
    wanted = (
        set(plan.replace_value) | set(plan.replace_statement) | set(plan.insert_before) | set(plan.insert_after) | set(plan.insert_above) | set(plan.wrap)
        | set(plan.add_item) | plan.remove | set(plan.append_to_class)
    )
    missing = wanted - editor.applied
    if missing:
        raise PlanNotApplied(f"no statement at {sorted(missing)} to edit")
    if plan.add_imports:
        context = CodemodContext()
        for module_name, name in plan.add_imports:
            AddImportsVisitor.add_needed_import(context, module_name, name)
        # AddImportsVisitor needs no metadata: visiting directly skips the deep copy
        # transform_module makes, and keeps untouched statements identical objects.
        body, inserted = _keep_spacing(edited, edited.visit(AddImportsVisitor(context)))
        edited = edited.with_changes(body=_place_stdlib_imports(body, inserted))
    drops = [(module, name, None) for module, name in plan.drop_imports]
    undecided = []
    if plan.remove_imports:
        unused, undecided = _split_removals(edited.code, plan.remove_imports)
        drops += unused
    if drops:
        edited = _hand_over_spacing(edited, edited.visit(_DropImports(drops)))
    if undecided:
        # `edited` is not used again, so the visitor's scope analysis may skip the deep copy
        # transform_module would make (most of apply's time on a large file).
        wrapper = MetadataWrapper(edited, unsafe_skip_copy=True)
        context = CodemodContext(wrapper=wrapper)
        for module_name, name, alias in undecided:
            RemoveImportsVisitor.remove_unused_import(context, module_name, name, alias)
        edited = _hand_over_spacing(edited, wrapper.visit(RemoveImportsVisitor(context)))
    if plan.runtime_import is not None and plan.runtime_import[1]:
        # After the removals, so that the import block it joins is the one the file keeps (a factory
        # import apply removed must not leave the runtime import in a block of its own).
        edited = add_sorted_import(edited, *plan.runtime_import, plan.own_packages)
    return edited


class _DropImports(cst.CSTTransformer):
    """Remove import bindings, given as (module, name or None, alias or None), whatever still reads them."""

    def __init__(self, drops) -> None:
        super().__init__()
        self.drops = set(drops)

    def _kept(self, aliases, module: str | None):
        kept = []
        for alias in aliases:
            full = get_full_name_for_node(alias.name)
            asname = get_full_name_for_node(alias.asname.name) if alias.asname is not None else None
            key = (module, full, asname) if module is not None else (full, None, asname)
            if key not in self.drops:
                kept.append(alias)
        return kept

    def _edit(self, updated, kept):
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(names=kept)

    def leave_Import(self, original, updated):
        return self._edit(updated, self._kept(updated.names, None))

    def leave_ImportFrom(self, original, updated):
        if updated.relative or updated.module is None or isinstance(updated.names, cst.ImportStar):
            return updated
        return self._edit(updated, self._kept(updated.names, get_full_name_for_node(updated.module)))

    def leave_SimpleStatementLine(self, original, updated):
        return cst.RemoveFromParent() if not updated.body else updated


def _split_removals(code: str, removals) -> tuple[list, list]:
    """(bindings nothing reads any more, bindings only libcst's scope analysis can decide).

    A plain `ast` pass over the edited code: a local name no expression reads and no string
    mentions (an annotation, `__all__`) is unused, and dropping it needs no scope analysis, the
    most expensive part of an edit on a large file. A name still read is kept; one that a string
    mentions goes to RemoveImportsVisitor.
    """
    tree = ast.parse(code)
    reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    strings = " ".join(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    unused, undecided = [], []
    for module, name, alias in removals:
        local = alias or name or module.split(".")[0]
        if local in reads:
            continue
        if re.search(rf"\b{re.escape(local)}\b", strings):
            undecided.append((module, name, alias))
        else:
            unused.append((module, name, alias))
    return unused, undecided


def _keep_spacing(before: cst.Module, after: cst.Module) -> tuple[list, set[int]]:
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


def _place_stdlib_imports(body: list, inserted: set[int]) -> list:
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


def _hand_over_spacing(before: cst.Module, after: cst.Module) -> cst.Module:
    """Give a removed import's leading lines to the statement after it (undoes _place_stdlib_imports)."""
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
    body, _ = _keep_spacing(before, after)
    return after.with_changes(body=body)
