"""Apply a plan of statement-level edits to a libcst tree, locating nodes by the positions `locate` found.

Scaffold, apply and revert only decide *what* changes (an EditPlan keyed by `(line, column)`
of statements from the ast analysis); this module is the single place that changes libcst
nodes, so every byte outside an edited statement is reproduced as it was.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

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
    insert_before: dict[Key, list[str]] = field(default_factory=dict)
    insert_after: dict[Key, list[str]] = field(default_factory=dict)
    wrap: dict[Key, tuple[Key, str, str]] = field(default_factory=dict)  # first -> (last, assignment, with header)
    add_item: dict[Key, tuple[str, str]] = field(default_factory=dict)  # With -> (name, "first" | "last")
    remove: set[Key] = field(default_factory=set)
    append_to_class: dict[Key, list[str]] = field(default_factory=dict)
    add_imports: list[tuple[str, str | None]] = field(default_factory=list)  # (module, name or None)
    remove_imports: list[tuple[str, str]] = field(default_factory=list)
    touched: int = 0  # sites and hooks this plan changes (for the summary line)

    def __bool__(self) -> bool:
        return any(
            (self.replace_value, self.insert_before, self.insert_after, self.wrap, self.add_item, self.remove,
             self.append_to_class, self.add_imports, self.remove_imports)
        )


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


class PlanNotApplied(RuntimeError):
    """The plan named a statement that the libcst tree does not have (an internal error)."""


def apply_plan(module: cst.Module, plan: EditPlan) -> cst.Module:
    """The module with the plan applied; raises PlanNotApplied when a planned edit found no node."""
    if not plan:
        return module
    editor = _Editor(plan, module)
    edited = MetadataWrapper(module, unsafe_skip_copy=True).visit(editor)
    wanted = (
        set(plan.replace_value) | set(plan.insert_before) | set(plan.insert_after) | set(plan.wrap)
        | set(plan.add_item) | plan.remove | set(plan.append_to_class)
    )
    missing = wanted - editor.applied
    if missing:
        raise PlanNotApplied(f"no statement at {sorted(missing)} to edit")
    if plan.add_imports:
        context = CodemodContext()
        for module_name, name in plan.add_imports:
            AddImportsVisitor.add_needed_import(context, module_name, name)
        before = edited
        edited = _keep_spacing(before, AddImportsVisitor(context).transform_module(edited))
    if plan.remove_imports:
        context = CodemodContext()
        for module_name, name in plan.remove_imports:
            RemoveImportsVisitor.remove_unused_import(context, module_name, name)
        edited = RemoveImportsVisitor(context).transform_module(edited)
    return edited


def _keep_spacing(before: cst.Module, after: cst.Module) -> cst.Module:
    """Undo the blank line AddImportsVisitor puts before the first statement after the imports.

    The file keeps its own spacing, and revert (which removes the import) gives back the
    input byte for byte.
    """
    inserted = len(after.body) - len(before.body)
    body = list(after.body)
    old = 0
    for new in range(len(body)):
        if old >= len(before.body):
            break
        original = before.body[old]
        if body[new].deep_equals(original):
            old += 1
        elif body[new].with_changes(leading_lines=original.leading_lines).deep_equals(original):
            body[new] = original
            old += 1
        elif new - old >= inserted:  # an existing import that gained names
            old += 1
    return after.with_changes(body=body)
