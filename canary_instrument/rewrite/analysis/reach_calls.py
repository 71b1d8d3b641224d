"""The statement and call half of reducing a file to reach facts: assignments, what a value holds,
call targets and trigger calls (mixed into the builder in reach.py).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
import fnmatch

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.reach_records import Edge, TriggerCall
from canary_instrument.rewrite.syntax.calls import call_pattern
from canary_instrument.rewrite.syntax.nodes import char_column, plain_dotted
from canary_instrument.rewrite.syntax.scopes import FunctionScope, built_with_flag

SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class CallFacts:
    """Statements and calls of the function scope being reduced (the builder's second half)."""

    def trigger_of(self, dotted: str):
        """The catalog trigger a call's dotted name matches, or None (a name met again is not matched again)."""
        known = self.memo.get(dotted, _UNKNOWN)
        if known is _UNKNOWN:
            match = self.triggers[0].match(dotted)
            known = self.memo[dotted] = self.triggers[1][match.lastgroup] if match is not None else None
        return known

    def kv_method(self, final: str) -> bool:
        """Whether a method name is one of the catalog's KV-reading forwards (by shape)."""
        known = self.memo.get((final,))
        if known is None:
            known = self.memo[(final,)] = self.kv_methods.match(final) is not None
        return known

    def assign(self, targets, value, annotation, scope: FunctionScope, cls: str | None) -> None:
        types = self.annotation_types(annotation)
        sources: tuple = tuple(("q", t) for t in types)
        alias = None
        if value is not None:
            self.walk(value, scope, cls)
            if not sources:
                sources = self.value_types(value, scope)
            dotted = plain_dotted(value)
            if dotted is not None and "." in dotted:
                alias = (self.call_target(value, scope), dotted)
        for target in targets:
            if isinstance(target, ast.Name):
                if cls is not None and annotation is not None:
                    self.class_attrs[cls][target.id].update(types)  # a dataclass-style field
                    self.names[target.id].update(types)
                elif sources:
                    scope.types[target.id] = sources
                else:
                    scope.types.pop(target.id, None)
                if alias is not None:
                    scope.aliases[target.id] = alias
                if value is not None and isinstance(value, ast.Name) and value.id in scope.batches:
                    scope.batches.add(target.id)
            elif isinstance(target, ast.Attribute):
                self.walk(target.value, scope, cls)
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    owner = scope.cls or _enclosing_class(scope)
                    if owner is not None and value is not None and self.draft_flag is not None:
                        self.note_draft(owner, target.attr, value)
                    qualified = tuple(s[1] for s in sources if s[0] == "q")
                    if owner is not None and sources:
                        # Qualified classes as names; what a call returns or a chain holds as its source.
                        self.class_attrs.setdefault(owner, defaultdict(set))[target.attr].update(
                            s[1] if s[0] == "q" else s for s in sources)
                    if qualified:
                        self.names[target.attr].update(qualified)
            else:
                self.walk(target, scope, cls)

    def note_draft(self, cls: str, attribute: str, value) -> None:
        """`self.X = Y(..., is_draft_worker=True)` builds a draft object; `self.X = self.Y.model_runner`
        (Y such an object) holds its model runner."""
        while isinstance(value, (ast.IfExp, ast.BoolOp)):
            value = value.body if isinstance(value, ast.IfExp) else value.values[0]
        if built_with_flag(value, self.draft_flag):
            self.flagged[cls].add(attribute)
            return
        dotted = plain_dotted(value)
        if dotted is not None and dotted.startswith("self."):
            parts = dotted.split(".")
            if len(parts) >= 3 and parts[1] in self.flagged.get(cls, ()):
                self.drafts[cls].add(attribute)

    def value_types(self, value, scope: FunctionScope) -> tuple:
        """The type sources of what an expression evaluates to (empty: the code does not show it)."""
        kind = type(value)
        if kind is ast.Call:
            dotted = plain_dotted(value.func)
            if dotted is not None and dotted.rpartition(".")[2][:1].isupper():
                head = dotted.partition(".")[0]
                if head not in scope.types and head != "self":
                    return (("q", self.qualify(dotted)),)
            target = self.call_target(value.func, scope)
            return (("call", target, scope.qualname),) if target is not None else ()
        if kind is ast.Name:
            return lookup(scope, "types", value.id) or ()
        if kind is ast.Attribute:
            if isinstance(value.value, ast.Name) and value.value.id == "self":
                return (("attr", value.attr),)
            inner = self.value_types(value.value, scope)
            return (("get", inner, value.attr),) if inner else ()
        if kind is ast.IfExp:
            return self.value_types(value.body, scope) + self.value_types(value.orelse, scope)
        if kind is ast.BoolOp:
            return tuple(s for v in value.values for s in self.value_types(v, scope))
        if kind is ast.NamedExpr:
            return self.value_types(value.value, scope)
        return ()

    def name_target(self, name: str, scope: FunctionScope) -> tuple | None:
        current = scope
        while current is not None:
            if name in current.nested:
                return ("def", current.nested[name])
            current = current.parent
        if name in self.imports or name in self.top_names:
            return ("global", self.qualify(name))
        return None

    def call_target(self, func, scope: FunctionScope) -> tuple | None:
        if isinstance(func, ast.Name):
            alias = lookup(scope, "aliases", func.id)
            if alias is not None:
                return alias[0]
            types = lookup(scope, "types", func.id)
            if types is not None:
                return ("typed", types, "__call__")
            return self.name_target(func.id, scope)
        if not isinstance(func, ast.Attribute):
            return None
        method = func.attr
        receiver = func.value
        if isinstance(receiver, ast.Name):
            if receiver.id == "self":
                return ("self", method)
            types = lookup(scope, "types", receiver.id)
            if types is not None:
                return ("typed", types, method)
            if receiver.id in self.imports or receiver.id in self.top_names:
                dotted = plain_dotted(func)
                return ("global", self.qualify(dotted)) if dotted else None
            return ("var", receiver.id, method)
        if isinstance(receiver, ast.Attribute):
            dotted = plain_dotted(receiver)
            if dotted is not None:
                head = dotted.partition(".")[0]
                if head != "self" and lookup(scope, "types", head) is None and head in (self.imports.keys() | self.top_names):
                    return ("global", self.qualify(f"{dotted}.{method}"))
            on_self = isinstance(receiver.value, ast.Name) and receiver.value.id == "self"
            return ("attr", receiver.attr, method, on_self)
        if isinstance(receiver, ast.Call):
            if isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                return ("super", method)
            inner = receiver.func
            word = inner.id if isinstance(inner, ast.Name) else inner.attr if isinstance(inner, ast.Attribute) else None
            return ("ret", self.call_target(inner, scope), method, word)
        while isinstance(receiver, (ast.Subscript, ast.Call)):
            receiver = receiver.value if isinstance(receiver, ast.Subscript) else receiver.func
        word = receiver.id if isinstance(receiver, ast.Name) else receiver.attr if isinstance(receiver, ast.Attribute) else None
        return ("name", method, word)

    def call(self, node: ast.Call, scope: FunctionScope) -> None:
        func = node.func
        target = self.call_target(func, scope)
        site = self.site_at(node) if self.spans else None
        dotted = plain_dotted(func)
        if isinstance(func, ast.Name) and (alias := lookup(scope, "aliases", func.id)) is not None:
            dotted = alias[1]
        final = dotted.rpartition(".")[2] if dotted else None
        trigger = None
        if dotted is not None:
            trigger = self.trigger_of(dotted)
        # A KV-reading forward is where a path ends: its callee (the model) is not followed.
        if target is not None and (target, site) not in scope.edges and (trigger is None or trigger.kind != "forward"):
            scope.edges[(target, site)] = Edge(target, node.lineno, site)
        owner = _enclosing_class(scope)
        if owner is not None and dotted is not None:
            if final in self.model_calls and dotted == f"self.{final}":
                self.class_calls_seen.add(owner)
            if trigger is None and dotted.startswith("self.") and final is not None and self.kv_method(final):
                self.pending[owner].append((scope.qualname, dotted, node.lineno, self.column(node), site))
        if trigger is not None:
            if trigger.kind == "forward":
                scope.kv = True
            passed = tuple(
                t for arg in (*node.args, *(k.value for k in node.keywords))
                if isinstance(arg, (ast.Name, ast.Attribute)) and (t := self.call_target(arg, scope)) is not None
                and (t[0] in ("def", "self", "global"))
            )
            scope.triggers.append(TriggerCall(
                dotted, trigger.kind, trigger.what, node.lineno, self.column(node), site,
                None if trigger.kind == "forward" else target, passed,
            ))
        elif final is not None and not scope.kv and self.kv_method(final):
            if self.takes_batch(node, scope):
                scope.kv = True

    def column(self, node) -> int:
        """A node's 1-based column in characters."""
        line = self.lines[node.lineno - 1] if node.lineno - 1 < len(self.lines) else ""
        return char_column(line, node.col_offset)

    def takes_batch(self, node: ast.Call, scope: FunctionScope) -> bool:
        for keyword in node.keywords:
            if keyword.arg in self.kv.batch_names:
                return True
        for value in (*node.args, *(k.value for k in node.keywords)):
            if isinstance(value, ast.Starred):
                value = value.value
            if isinstance(value, ast.Name) and (value.id in self.kv.batch_names or value.id in scope.batches):
                return True
            if isinstance(value, ast.Attribute) and value.attr in self.kv.batch_names:
                return True
        return False


_MATCHERS: list = [None, None]  # [catalog, its matchers]: built once per catalog, not once per file
_UNKNOWN = object()


def matchers(catalog: Catalog) -> tuple[tuple[re.Pattern, dict[str, object]], re.Pattern, dict]:
    """The trigger matchers and the KV-forward method regex of `catalog`, and the memo of their
    answers (`CallFacts.trigger_of`, `kv_method`) that the files of one catalog share."""
    if _MATCHERS[0] is not catalog:
        methods = re.compile("|".join(fnmatch.translate(m) for m in catalog.kv_forward.methods) or "(?!)")
        _MATCHERS[:] = [catalog, (_trigger_matchers(catalog), methods, {})]
    return _MATCHERS[1]


def _trigger_matchers(catalog: Catalog) -> tuple[re.Pattern, dict[str, object]]:
    """One regex for `call_matches` over every trigger's patterns (tried once per call), a named group
    per trigger, and the triggers by group name: the first trigger in catalog order whose patterns
    match is the group that matches (alternatives are tried in order, each to the end of the name)."""
    groups = []
    by_group = {}
    for index, trigger in enumerate(catalog.triggers):
        groups.append(f"(?P<t{index}>{call_pattern(trigger.calls)})")
        by_group[f"t{index}"] = trigger
    return re.compile("|".join(groups) or "(?!)"), by_group


def lookup(scope: FunctionScope, table: str, name: str):
    """A local's entry in `table`, looked up through the enclosing functions (closures)."""
    while scope is not None:
        value = getattr(scope, table).get(name)
        if value is not None:
            return value
        scope = scope.parent
    return None


def _enclosing_class(scope: FunctionScope) -> str | None:
    while scope is not None:
        if scope.cls is not None:
            return scope.cls
        scope = scope.parent
    return None
