"""Find where each hook goes (after the KV pool exists, after graph capture, after the prefix cache exists) by shape,
and recognise hooks already there: generated ones and upstream's hand-written ones.

Placement rules (docs/cli.md, "Hooks"):

- `after_assign`: after the statement that completes one of the hook's `assigns` in its scope
  (an attribute the scope builds itself, not one handed to it as a parameter), extended over
  the plain attribute assignments that follow it; or after a call of one of `after_calls` (a
  builder defined elsewhere, e.g. in a mixin). When the building method is called from another
  method of the class, the hook goes after that call instead (one level up, so it follows the
  init chain). When the method then ends by handing over to another method of its class (a
  post-pool wiring method), the hook goes at the start of that method.
- `after_capture`: at the end of the function that captures the most graph kinds (calls of
  `after_calls`), skipping functions that only hand the model runner to capture code elsewhere
  (that code is found in its own file); before a final `return`. When that function ends by
  handing the model runner to a function of its own file (a post-capture finaliser), at the
  end of that function.

Standard-library `ast` only.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from canary_instrument.catalog import Catalog, Hook
from canary_instrument.rewrite.analysis.hook_places import (
    CallIndex,
    hook_callee,
    expand,
    handed_off,
    hook_scopes,
    module_functions,
    place_after_assign,
    place_after_capture,
)
from canary_instrument.rewrite.handwritten import HandHook, parse_hook
from canary_instrument.rewrite.syntax.blocks import walk_blocks
from canary_instrument.rewrite.syntax.imports import Imports
from canary_instrument.rewrite.syntax.nodes import dotted_name, functions_of, statements


@dataclass
class PresentHook:
    node: ast.stmt
    block: list[ast.stmt]
    handwritten: HandHook | None = None  # None: generated
    migrated: str = ""  # hand-written: the generated statement apply puts in its place


@dataclass
class HookMatch:
    """A hook role in one file: where it goes (if a place is found) and the statements of it already there."""

    hook: Hook
    class_node: ast.ClassDef | None = None
    method: ast.FunctionDef | None = None
    anchor: ast.stmt | None = None
    mode: str = "after"  # insert "after" or "before" the anchor
    statement: str = ""  # the hook statement spelled for its scope
    present: list[PresentHook] = field(default_factory=list)

    @property
    def where(self) -> str:
        if self.method is None:
            return "?"
        return f"{self.class_node.name}.{self.method.name}" if self.class_node is not None else self.method.name


def recognise(tree: ast.Module, catalog: Catalog, imports: Imports, facts, functions=None,
              site_managers=None) -> dict[str, list[PresentHook]]:
    """Every hook statement already in the file, by role: generated ones and hand-written ones
    (`functions`: `functions_of(tree)`, when the caller has listed them; `site_managers`: class id ->
    {manager name: the manager as the class's sites spell it})."""
    by_callee: dict[str, list[Hook]] = {}
    for hook in catalog.hooks:
        callee = hook_callee(hook)
        if callee is not None:
            by_callee.setdefault(callee, []).append(hook)
    present: dict[str, list[PresentHook]] = {}
    manager_hooks = [h for h in catalog.hooks if h.scope == "manager"]
    for cls, function in functions_of(tree) if functions is None else functions:
        for block, _, _ in walk_blocks(function.body):
            for stmt in block:
                call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
                if isinstance(call, ast.Call) and (name := dotted_name(call.func)) is not None:
                    callee = name.rpartition(".")[2]
                    resolved = imports.resolve(name)
                    # The runtime's function, or its bare name with no import yet (a hook pasted by hand).
                    ours = resolved == f"{catalog.runtime_module}.{callee}" or resolved == name == callee
                    if ours and callee in by_callee:
                        spelled = (site_managers or {}).get(id(cls), {}) if cls is not None else {}
                        role = _generated_role(stmt, by_callee[callee], spelled, catalog)
                        present.setdefault(role, []).append(PresentHook(stmt, block))
                        continue
                hand = parse_hook(stmt)
                if hand is not None:
                    spelled = (site_managers or {}).get(id(cls), {}) if cls is not None else {}
                    role = _hand_role(hand, catalog, manager_hooks, spelled)
                    if role is not None:
                        hook = next(h for h in catalog.hooks if h.role == role)
                        migrated = expand(hook, hand.manager.rpartition(".")[0], hand.argument or "")
                        if hook.scope == "manager" and hook.manager in spelled:
                            catalog_owner = catalog.managers[hook.manager].owner
                            migrated = re.sub(rf"{re.escape(catalog_owner)}(?![\w])", spelled[hook.manager].owner,
                                              migrated)
                        present.setdefault(role, []).append(PresentHook(stmt, block, hand, migrated))
    return present


_KINDS = {"install_canary": "install", "mark_init_finished": "init_finished", "attach_radix_cache": "attach_cache"}


def _hand_role(hand: HandHook, catalog: Catalog, manager_hooks, spelled: dict) -> str | None:
    """The role of a hand-written hook: by what it calls, and for init-finished by whose manager it marks."""
    if hand.kind == "init_finished":
        for hook in manager_hooks:
            expressions = {catalog.managers[hook.manager].expression}
            if hook.manager in spelled:
                expressions.add(spelled[hook.manager].expression)
            if hand.manager in expressions:
                return hook.role
    for hook in catalog.hooks:
        if _KINDS.get(hook_callee(hook)) == hand.kind and hook not in manager_hooks:
            return hook.role
    return None


def _generated_role(stmt, hooks, spelled: dict, catalog: Catalog) -> str:
    """The role of a generated hook statement: the only hook calling its callee, else the one it spells."""
    if len(hooks) == 1:
        return hooks[0].role
    text = ast.unparse(stmt)
    for hook in hooks:
        if hook.scope != "manager":
            continue
        manager = spelled.get(hook.manager, catalog.managers[hook.manager])
        if manager.expression in text or catalog.managers[hook.manager].expression in text:
            return hook.role
    return next((h.role for h in hooks if h.scope != "manager"), hooks[0].role)


def locate_hooks(tree: ast.Module, catalog: Catalog, imports: Imports, facts, *,
                 classes: list[ast.ClassDef] | None = None, functions=None, sites=(),
                 handed: set[str] | None = None) -> list[HookMatch]:
    """One HookMatch per hook role that has a place or a statement in this file (`classes` and `functions`: the
    file's classes and `functions_of(tree)`, when the caller has listed them)."""
    site_managers: dict[int, dict] = {}
    for site in sites:
        if site.class_node is not None:
            site_managers.setdefault(id(site.class_node), {}).setdefault(site.manager.name, site.manager)
    if classes is None:
        classes = [node for node in statements(tree) if isinstance(node, ast.ClassDef)]
    calls = CallIndex()
    present = recognise(tree, catalog, imports, facts, functions, site_managers)
    module = module_functions(tree)
    matches = []
    for hook in catalog.hooks:
        match = HookMatch(hook, present=present.get(hook.role, []))
        placed = []
        scopes = hook_scopes(hook, tree, classes, facts, catalog, site_managers)
        for scope in scopes:
            if hook.place == "after_capture":
                if handed is not None and scope.class_node is not None:
                    handed |= handed_off(hook, scope, module, calls, imports)
                found = place_after_capture(hook, scope, module, calls)
                if found is not None:
                    function, anchor, mode = found
                    placed.append((scope, function, anchor, mode, ""))
            else:
                found = place_after_assign(hook, scope, module, calls)
                if found is not None:
                    function, anchor, mode, value = found
                    placed.append((scope, function, anchor, mode, value or ""))
        if placed:
            # One place per role and file: the scope whose place comes first in the file.
            scope, function, anchor, mode, value = min(placed, key=lambda item: item[2].lineno)
            owner = scope.class_node if any(f is function for f in scope.functions) else None
            match.class_node, match.method, match.anchor, match.mode = owner, function, anchor, mode
            match.statement = expand(hook, scope.runner, value)
            if scope.owner is not None:
                old, new = scope.owner
                match.statement = re.sub(rf"{re.escape(old)}(?![\w])", new, match.statement)
        if match.anchor is not None or match.present:
            matches.append(match)
    return matches


__all__ = ["HookMatch", "PresentHook", "locate_hooks"]
