"""Apply a plan of statement-level edits to a libcst tree, locating nodes by the positions `locate` found.

Scaffold, apply and revert only decide *what* changes (an EditPlan, transforms/plan.py); this
module is the single place that changes libcst nodes, so every byte outside an edited
statement is reproduced as it was. It is imported only when a plan has work to do.
"""

from __future__ import annotations

import ast
import re

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider

from canary_instrument.rewrite.transforms.imports import (
    add_sorted_import,
    hand_over_spacing,
    keep_spacing,
    place_stdlib_imports,
)
from canary_instrument.rewrite.transforms.plan import EditPlan, Key, PlanNotApplied


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
        body, inserted = keep_spacing(edited, edited.visit(AddImportsVisitor(context)))
        edited = edited.with_changes(body=place_stdlib_imports(body, inserted))
    drops = [(module, name, None) for module, name in plan.drop_imports]
    undecided = []
    if plan.remove_imports:
        unused, undecided = _split_removals(edited.code, plan.remove_imports)
        drops += unused
    if drops:
        edited = hand_over_spacing(edited, edited.visit(_DropImports(drops)))
    if undecided:
        # `edited` is not used again, so the visitor's scope analysis may skip the deep copy
        # transform_module would make (most of apply's time on a large file).
        wrapper = MetadataWrapper(edited, unsafe_skip_copy=True)
        context = CodemodContext(wrapper=wrapper)
        for module_name, name, alias in undecided:
            RemoveImportsVisitor.remove_unused_import(context, module_name, name, alias)
        edited = hand_over_spacing(edited, wrapper.visit(RemoveImportsVisitor(context)))
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
