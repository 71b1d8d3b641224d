"""Recognise upstream's hand-written canary wiring, so it can be reported (CI106) and migrated, never called stray.

sglang wires each site by hand with a conditional expression and each hook with an `if`:

    canary_ctx = (
        context_tuple(c.with_ops_outside_graph(single_forward_indices=[0], maybe_inaccurate_forward_batch=fb),
                      c.with_active_single_forward_manager(0))
        if not self.is_draft_worker and ((c := self.canary_manager) is not None)
        else contextlib.nullcontext()
    )
    if (c := self.draft_runner.canary_manager) is not None:
        c.mark_init_finished()

This module parses such code into its parts (manager, guard, the outside-graph indices and
forward batch, the active sub-forward) by shape; the callees' module does not matter.
Standard-library `ast` only: `check` runs it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

OUTSIDE_METHOD = "with_ops_outside_graph"
ACTIVE_METHOD = "with_active_single_forward_manager"
TUPLE_HELPER = "context_tuple"
INSTALL = "install_canary"
MANAGER_ATTRIBUTE = "canary_manager"
HOOK_METHODS = {"mark_init_finished": "init_finished", "attach_radix_cache": "attach_cache"}


@dataclass(frozen=True)
class HandWired:
    """The parts of a hand-written site expression, as source text."""

    manager: str
    guard: str | None
    outside: str | None
    forward_batch: str | None
    active: str | None
    reads: frozenset[str]  # names the expression reads (imports migration may leave unused)

    @property
    def evidence(self) -> frozenset[str]:
        return frozenset(name for name, value in (("outside", self.outside), ("active", self.active)) if value)


@dataclass(frozen=True)
class HandHook:
    """A hand-written hook statement: `install`, `init_finished` (mark_init_finished) or `attach_cache`."""

    kind: str
    manager: str  # the manager expression (`self.canary_manager`, `self.draft_runner.canary_manager`)
    guard: str | None = None
    argument: str | None = None  # attach_cache: the cache expression
    reads: frozenset[str] = frozenset()


def last_name(node: ast.AST) -> str | None:
    """The last component of a callee: `attach` for `a.b.attach`, `f` for `f`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _reads(node: ast.AST, skip: str | None = None) -> frozenset[str]:
    return frozenset(
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id != skip
    )


def _guarded_manager(test: ast.expr):
    """(manager node, handle node, guard node) of `(c := MGR) is not None [and not GUARD]`, either order."""
    conjuncts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    manager = handle = guard = None
    for conjunct in conjuncts:
        if (
            isinstance(conjunct, ast.Compare) and len(conjunct.ops) == 1 and isinstance(conjunct.ops[0], ast.IsNot)
            and isinstance(conjunct.comparators[0], ast.Constant) and conjunct.comparators[0].value is None
            and manager is None
        ):
            left = conjunct.left
            if isinstance(left, ast.NamedExpr):
                manager, handle = left.value, left.target
            else:
                manager, handle = left, left
        elif isinstance(conjunct, ast.UnaryOp) and isinstance(conjunct.op, ast.Not) and guard is None:
            guard = conjunct.operand
        else:
            return None
    if manager is None or last_name(manager) != MANAGER_ATTRIBUTE:
        return None
    return manager, handle, guard


def _same(first: ast.AST, second: ast.AST) -> bool:
    """The same expression, whatever each occurrence's load/store context."""
    return ast.unparse(first) == ast.unparse(second)


def _on(call: ast.AST, handle: ast.AST, method: str) -> bool:
    return (
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == method
        and _same(call.func.value, handle)
    )


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def is_null_context(node: ast.AST, resolve, factory: str, null_contexts) -> bool:
    """A zero-argument call of a null context: the resolved placeholder factory, or a callee named like one."""
    if not isinstance(node, ast.Call) or node.args or node.keywords:
        return False
    name = last_name(node.func)
    dotted = ast.unparse(node.func)
    return resolve(dotted) == factory or name in null_contexts


def parse_site(value: ast.AST, resolve, factory: str, null_contexts) -> HandWired | None:
    """The parts of `BODY if (c := MGR) is not None [and not GUARD] else NULL`, or None for any other shape."""
    if not isinstance(value, ast.IfExp) or not is_null_context(value.orelse, resolve, factory, null_contexts):
        return None
    found = _guarded_manager(value.test)
    if found is None:
        return None
    manager, handle, guard = found
    body = value.body
    if isinstance(body, ast.Call) and last_name(body.func) == TUPLE_HELPER and not body.keywords:
        calls = list(body.args)
    else:
        calls = [body]
    outside = forward_batch = active = None
    for call in calls:
        if _on(call, handle, OUTSIDE_METHOD) and outside is None:
            outside = _argument(call, 0, "single_forward_indices")
            forward_batch = _argument(call, 1, "maybe_inaccurate_forward_batch")
            if outside is None:
                return None
        elif _on(call, handle, ACTIVE_METHOD) and active is None:
            active = _argument(call, 0, "index")
            if active is None:
                return None
        else:
            return None
    skip = handle.id if isinstance(handle, ast.Name) and handle is not manager else None
    return HandWired(
        manager=ast.unparse(manager), guard=_text(guard), outside=_text(outside),
        forward_batch=_text(forward_batch), active=_text(active), reads=_reads(value, skip),
    )


def parse_hook(stmt: ast.stmt) -> HandHook | None:
    """A hand-written install assignment or `if MGR is not None: MGR.mark_init_finished()`-style hook."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if (
            isinstance(target, ast.Attribute) and target.attr == MANAGER_ATTRIBUTE
            and isinstance(stmt.value, ast.Call) and last_name(stmt.value.func) == INSTALL
        ):
            return HandHook("install", ast.unparse(target), reads=_reads(stmt.value))
        return None
    if not isinstance(stmt, ast.If) or stmt.orelse or len(stmt.body) != 1 or not isinstance(stmt.body[0], ast.Expr):
        return None
    found = _guarded_manager(stmt.test)
    if found is None:
        return None
    manager, handle, guard = found
    call = stmt.body[0].value
    for method, kind in HOOK_METHODS.items():
        if _on(call, handle, method):
            expected = 1 if kind == "attach_cache" else 0
            if len(call.args) != expected or call.keywords:
                return None
            argument = _text(call.args[0]) if expected else None
            skip = handle.id if isinstance(handle, ast.Name) and handle is not manager else None
            return HandHook(kind, ast.unparse(manager), _text(guard), argument, _reads(stmt, skip))
    return None
