"""Where a hook goes in its scope, by shape: after what builds what it needs, or at the end of graph capture.

The rules themselves are in hooks.py's header (docs/cli.md, "Hooks"). Standard-library `ast` only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from canary_instrument.catalog import Catalog, Hook, call_matches
from canary_instrument.rewrite.analysis.shapes import function_model_runner
from canary_instrument.rewrite.handwritten import last_name
from canary_instrument.rewrite.syntax.blocks import top_statement, walk_blocks
from canary_instrument.rewrite.syntax.calls import calls_matcher
from canary_instrument.rewrite.syntax.imports import Imports
from canary_instrument.rewrite.syntax.nodes import FUNCTIONS, dotted_name, first_statement, iter_calls, parameters


@dataclass
class _HookScope:
    """Where a hook may go: a class's methods (or the module-level functions handed one model runner)
    and how they spell that runner. Not a `syntax.scopes` model: it is a role's search space, chosen
    by the catalog's hook scope, not a fact of the code."""

    class_node: ast.ClassDef | None
    runner: str  # the model runner as the scope spells it (`self`, a parameter, `self.tp_worker.model_runner`)
    functions: list
    owner: tuple[str, str] | None = None  # (catalog's, class's) spelling of a manager owner held under another name


def expand(hook: Hook, runner: str, value: str = "") -> str:
    return hook.statement.replace("{model_runner}", runner).replace("{value}", value)


def hook_callee(hook: Hook) -> str | None:
    return _callee(hook.statement)


@lru_cache(maxsize=None)
def _callee(statement: str) -> str | None:
    """The function a hook statement calls (asked for each hook of each file: parsed once)."""
    node = ast.parse(statement.replace("{model_runner}", "self").replace("{value}", "self.value")).body[0]
    value = node.value
    return last_name(value.func) if isinstance(value, ast.Call) else None


def hook_scopes(hook: Hook, tree: ast.Module, classes: list, facts, catalog: Catalog,
                site_managers) -> list[_HookScope]:
    """`site_managers`: class id -> {manager name: the manager as the class's sites spell it}."""
    shape = catalog.model_runner
    scopes = []
    for cls in classes:
        info = facts(cls)
        methods = list(info.methods.values())
        if hook.scope == "model_runner" and info.is_model_runner(shape):
            scopes.append(_HookScope(cls, "self", methods))
        elif hook.scope == "holder" and not info.is_model_runner(shape):
            held = info.held_model_runner(shape)
            if held is not None:
                scopes.append(_HookScope(cls, held, methods))
        elif hook.scope == "manager":
            owner = catalog.managers[hook.manager].owner
            spelled = site_managers.get(id(cls), {}).get(hook.manager)
            if spelled is not None and spelled.owner != owner:
                # The class's sites run on this manager, held under the class's own name for it.
                scopes.append(_HookScope(cls, "self", methods, (owner, spelled.owner)))
            elif info.reaches(owner):
                scopes.append(_HookScope(cls, "self", methods))
    if hook.scope == "model_runner":
        module = {}
        for node in tree.body:
            if isinstance(node, FUNCTIONS) and (runner := function_model_runner(node, shape)) is not None:
                module.setdefault(runner, []).append(node)
        scopes.extend(_HookScope(None, runner, functions) for runner, functions in module.items())
    return scopes


def module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, FUNCTIONS)}


def _passes(call: ast.Call, runner: str) -> bool:
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(dotted_name(value) == runner for value in values)


def _own_callee(call: ast.Call, scope: _HookScope, module: dict):
    """The function of this file a call runs: `self.m()` in a class, `g()` at module level."""
    name = dotted_name(call.func)
    if name is None:
        return None
    if scope.class_node is not None and name.startswith("self.") and name.count(".") == 1:
        return next((f for f in scope.functions if f.name == name[5:]), None)
    if "." not in name:
        return module.get(name)
    return None


def _calls_in(function):
    for stmt in function.body:
        yield from iter_calls(stmt)


class CallIndex:
    """The calls each function of a file runs (`iter_calls` of its statements, in that order), listed
    once per file: every hook asks about the same functions."""

    def __init__(self) -> None:
        self._calls: dict[int, list[ast.Call]] = {}
        self._matching: dict[tuple, list[ast.Call]] = {}

    def __call__(self, function) -> list[ast.Call]:
        calls = self._calls.get(id(function))
        if calls is None:
            calls = self._calls[id(function)] = list(_calls_in(function))
        return calls

    def matching(self, function, patterns) -> list[ast.Call]:
        """The calls of `function` whose dotted name matches one of the catalog call `patterns`."""
        key = (id(function), tuple(patterns))
        found = self._matching.get(key)
        if found is None:
            matcher = calls_matcher(key[1])
            found = self._matching[key] = [
                call for call in self(function) if (name := dotted_name(call.func)) is not None and matcher(name)
            ]
        return found


def _capture_calls(function, hook: Hook, calls: CallIndex) -> list[ast.Call]:
    return calls.matching(function, hook.after_calls)


def _early_return(function) -> bool:
    last = function.body[-1]
    # A return is a statement, and statements nest only in statements' blocks.
    for block, _, _ in walk_blocks(function.body):
        if any(isinstance(stmt, ast.Return) and stmt is not last for stmt in block):
            return True
    return False


def _end_of(function, hook: Hook, calls: CallIndex) -> tuple[ast.stmt, str]:
    """Where "at the end" of a function is: before its final return, else after its last statement.

    A function that can return early gets the hook right after its last statement that
    captures instead, so that no path skips it.
    """
    if _early_return(function):
        captures = _capture_calls(function, hook, calls)
        tops = [top_statement(function, call) for call in captures]
        if tops:
            return max(tops, key=lambda stmt: stmt.lineno), "after"
    last = function.body[-1]
    if isinstance(last, ast.Return) and len(function.body) > 1:
        return last, "before"
    return last, "after"


def _handed_over_to(stmt: ast.stmt, scope: _HookScope, module: dict):
    """The function of this file that `stmt` hands the model runner to (`finalize(model_runner)`,
    possibly under an `if`), else None."""
    if isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1:
        stmt = stmt.body[0]
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return None
    call = stmt.value
    name = dotted_name(call.func)
    if name is None or "." in name or name not in module or not _passes(call, scope.runner):
        return None
    return module[name]


def handed_off(hook: Hook, scope: _HookScope, module: dict, calls: CallIndex, imports: Imports) -> set[str]:
    """The modules whose functions this scope hands the model runner to for capture (`capture_graphs(self)`,
    imported): where its `after_capture` hook goes, though no catalog location names that file."""
    found = set()
    for function in scope.functions:
        for call in _capture_calls(function, hook, calls):
            name = dotted_name(call.func)
            if _own_callee(call, scope, module) is None and _passes(call, scope.runner):
                qualified = imports.resolve(name)
                if qualified != name or "." in name:
                    found.add(qualified.rpartition(".")[0])
    return found


def place_after_capture(hook: Hook, scope: _HookScope, module: dict, calls: CallIndex):
    captures = {id(f): _capture_calls(f, hook, calls) for f in scope.functions}
    memo: dict[int, bool] = {}

    def delegated(function, seen=()) -> bool:
        if id(function) in memo:
            return memo[id(function)]
        if id(function) in seen:
            return False
        result = True
        for call in captures.get(id(function)) or _capture_calls(function, hook, calls):
            own = _own_callee(call, scope, module)
            if own is not None:
                if not (_capture_calls(own, hook, calls) and delegated(own, (*seen, id(function)))):
                    result = False
            elif not _passes(call, scope.runner):
                result = False
        memo[id(function)] = result
        return result

    candidates = [f for f in scope.functions if captures[id(f)] and not delegated(f)]
    if not candidates:
        return None
    called = {
        id(own) for f in candidates for call in captures[id(f)]
        if (own := _own_callee(call, scope, module)) is not None
    }

    def kinds(function):
        return len({dotted_name(call.func).rpartition(".")[2] for call in captures[id(function)]})

    best = max(candidates, key=lambda f: (kinds(f), id(f) not in called, -f.lineno))
    anchor, mode = _end_of(best, hook, calls)
    before = anchor if mode == "after" else _previous(best, anchor)
    target = _handed_over_to(before, scope, module) if before is not None else None
    if target is not None:
        anchor, mode = _end_of(target, hook, calls)
        return target, anchor, mode
    return best, anchor, mode


def _previous(function, stmt):
    index = next(i for i, s in enumerate(function.body) if s is stmt)
    return function.body[index - 1] if index else None


def _builds(node: ast.AST, function, scope: _HookScope, hook: Hook) -> str | None:
    """The target text when `node` assigns one of the hook's attributes a value the scope builds, else None."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return None
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    flat = []
    for target in targets:
        flat.extend(target.elts if isinstance(target, ast.Tuple) else [target])
    names = [dotted_name(t) for t in flat if isinstance(t, ast.Attribute)]
    owner = "self" if scope.class_node is not None else scope.runner
    wanted = [n for n in names if n is not None and n.rpartition(".")[0] == owner
              and n.rpartition(".")[2] in hook.assigns]
    if not wanted:
        return None
    value = node.value
    if isinstance(value, ast.Constant):
        return None
    root = value
    while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
        root = root.func if isinstance(root, ast.Call) else root.value
    handed = {a.arg for a in parameters(function)} - {"self", scope.runner}
    if isinstance(root, ast.Name) and root.id in handed:
        return None  # an attribute handed to this scope, not built by it
    return wanted[0]


def _plain_assignment(stmt: ast.stmt) -> bool:
    """An attribute assignment without calls, or an `if` holding only those: what follows the pool and belongs to it."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        if stmt.value is None or any(True for _ in iter_calls(stmt.value)):
            return False
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return all(isinstance(t, ast.Attribute) for t in targets)
    if isinstance(stmt, ast.If):
        return all(_plain_assignment(s) for s in (*stmt.body, *stmt.orelse))
    return False


def place_after_assign(hook: Hook, scope: _HookScope, module: dict, calls: CallIndex):
    found = []  # (function, top statement, built value or None)
    for function in scope.functions:
        # A statement of the function can call a builder only when the function does (most do not).
        builder = bool(hook.after_calls) and bool(calls.matching(function, hook.after_calls))
        for block, _, _ in walk_blocks(function.body):
            for stmt in block:
                value = _builds(stmt, function, scope, hook)
                if value is not None:
                    found.append((function, top_statement(function, stmt), value))
                elif builder and not any(isinstance(_, ast.stmt) for _ in ast.iter_child_nodes(stmt)) and any(
                    call_matches(name, p) for call in iter_calls(stmt)
                    if (name := dotted_name(call.func)) is not None for p in hook.after_calls
                ):
                    found.append((function, top_statement(function, stmt), None))
    if not found:
        return None
    function, anchor, value = min(found, key=lambda item: item[1].lineno)
    if value is not None:
        caller = _caller(function, scope, module, calls)
        if caller is not None:
            function, anchor = caller
        else:
            body = function.body
            index = next(i for i, s in enumerate(body) if s is anchor)
            while index + 1 < len(body) and _plain_assignment(body[index + 1]):
                index += 1
            anchor = body[index]
    body = function.body
    index = next(i for i, s in enumerate(body) if s is anchor)
    if index + 2 == len(body):
        follow = body[-1]
        if isinstance(follow, ast.Expr) and isinstance(follow.value, ast.Call) and not follow.value.args \
                and not follow.value.keywords:
            target = _own_callee(follow.value, scope, module)
            if target is not None and target is not function:
                return target, first_statement(target), "before", value
    return function, anchor, "after", value


def _caller(function, scope: _HookScope, module: dict, calls: CallIndex):
    """(caller, its top statement) of the first call of `function` elsewhere in its scope, else None."""
    for other in scope.functions:
        if other is function:
            continue
        for call in calls(other):
            # The name test first: resolving every call of a large class is most of the search.
            func = call.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != function.name:
                continue
            if _own_callee(call, scope, module) is function:
                return other, top_statement(other, call)
    return None
