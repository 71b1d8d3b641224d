"""Uncovered forward paths (check's CI301), decided over the whole tree.

`reach_facts` reduces one parsed file to plain data: its classes (bases, attribute types), its
functions (the calls and function references each makes, and which of them sit inside a catalogued
site) and the catalog's trigger calls among them. `uncovered_findings` joins the facts of every
analysed file into one call graph, following calls between files through what the code shows, and
reports each trigger that some path reaches outside every catalogued site.
"""

from __future__ import annotations

import ast
from collections import defaultdict
import fnmatch
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.reach_calls import SCOPE_NODES, CallFacts, lookup, matchers
from canary_instrument.rewrite.analysis.reach_records import (
    MODULE,
    ClassRecord,
    DefFacts,
    Edge,
    ReachFacts,
    TriggerCall,
    module_name,
    site_spans,
)
from canary_instrument.rewrite.syntax.imports import bindings
from canary_instrument.rewrite.syntax.nodes import CANARY_CONTEXT, SCALAR_FIELDS, plain_dotted, statements
from canary_instrument.rewrite.syntax.scopes import FunctionScope

__all__ = ["MODULE", "ClassRecord", "DefFacts", "Edge", "ReachFacts", "TriggerCall", "reach_facts", "site_spans"]


class _FactsBuilder(CallFacts):
    def __init__(self, path: Path, lines: list[str], spans, catalog: Catalog) -> None:
        self.module = module_name(path)
        parts = self.module.split(".")
        self.package = parts if Path(path).stem == "__init__" else parts[:-1]
        self.lines = lines
        self.spans = list(spans)
        self.brackets = catalog.placeholder_names
        self.triggers, self.kv_methods, self.memo = matchers(catalog)
        self.kv = catalog.kv_forward
        self.imports: dict[str, str] = {}
        self.top_names: set[str] = set()  # functions and classes defined at module level
        self.classes: list[ClassRecord] = []
        self.class_attrs: dict[str, dict[str, set[str]]] = {}
        self.names: dict[str, set[str]] = defaultdict(set)
        self.defs: list[DefFacts] = []
        # Trigger calls a class spells its own way (`self.model.forward` in the model runner, the draft
        # runner under another attribute), decided once the class's body is read (`respell`).
        self.model_calls = tuple(catalog.model_runner.class_calls)
        self.draft_flag = next(iter(sorted(m.guard.rpartition(".")[2] for m in catalog.managers.values() if m.guard)),
                               None)
        # The owners of the managers a draft runner's sites use: unguarded, held in an attribute that is
        # not named like the target's model runner (`self.draft_runner`).
        self.draft_owners = tuple(sorted({
            owner for m in catalog.managers.values()
            if m.guard is None and (owner := m.expression.rpartition(".")[0]).count(".") == 1
            and owner.startswith("self.")
            and not any(fnmatch.fnmatchcase(owner[5:], p) for p in catalog.model_runner.names)
        }))
        self.pending: dict[str, list[tuple[str, str, int, int, str | None]]] = defaultdict(list)
        self.class_calls_seen: set[str] = set()  # classes that call the model runner's raw forward
        self.flagged: dict[str, set[str]] = defaultdict(set)  # class -> attributes built with the draft flag
        self.drafts: dict[str, set[str]] = defaultdict(set)  # class -> attributes holding a draft model runner

    # -- names -------------------------------------------------------------------------------------
    def qualify(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        if head in self.imports:
            base = self.imports[head]
        elif head in self.top_names:
            base = f"{self.module}.{head}" if self.module else head
        else:
            return dotted
        return f"{base}.{rest}" if rest else base

    def annotation_types(self, node) -> tuple[str, ...]:
        """Qualified names of the classes an annotation names (`Optional[A]`, `A | None`, `"A"`)."""
        if node is None:
            return ()
        out = []
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, ast.Constant) and isinstance(current.value, str):
                try:
                    stack.append(ast.parse(current.value, mode="eval").body)
                except SyntaxError:
                    pass
                continue
            dotted = plain_dotted(current)
            if dotted is not None:
                if dotted not in ("None", "Optional", "Union", "typing.Optional", "typing.Union"):
                    out.append(self.qualify(dotted))
                continue
            if isinstance(current, ast.Subscript):
                stack.append(current.slice)
                head = plain_dotted(current.value)
                if head is not None and head.rpartition(".")[2] not in ("Optional", "Union"):
                    out.append(self.qualify(head))
            elif isinstance(current, (ast.BinOp, ast.Tuple, ast.List)):
                stack.extend(ast.iter_child_nodes(current))
        return tuple(out)

    def site_at(self, node) -> str | None:
        position = (node.lineno, node.col_offset)
        for role, start, end in self.spans:
            if start <= position < end:
                return role
        return None

    # -- walk ----------------------------------------------------------------------------------------
    def build(self, tree: ast.Module) -> ReachFacts:
        for stmt in tree.body:
            if isinstance(stmt, SCOPE_NODES):
                self.top_names.add(stmt.name)
        self.collect_imports(tree)
        self.bound = self.top_names | _names_bound(tree)
        module = FunctionScope(MODULE, None, 1, None)
        self.walk_block(tree.body, module, None)
        self.finish(module)
        return ReachFacts(
            module=self.module,
            classes=tuple(self.classes),
            defs=tuple(self.defs),
            names=tuple((name, tuple(sorted(types))) for name, types in sorted(self.names.items())),
        )

    def collect_imports(self, tree: ast.Module) -> None:
        """Module-level imports, also those under `if TYPE_CHECKING:` or `try:` (function-level ones
        are added when the walk meets them)."""
        stack = list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
                for block in ("body", "orelse", "finalbody"):
                    stack.extend(getattr(node, block, ()))
                for handler in getattr(node, "handlers", ()):
                    stack.extend(handler.body)
            else:
                self.add_import(node)

    def add_import(self, node) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for local, qualified, bare in bindings(node, self.package):
                if bare:
                    self.imports.setdefault(local, qualified)  # `import a.b` keeps what `a` already names
                else:
                    self.imports[local] = qualified

    def walk_block(self, stmts, scope: FunctionScope, cls: str | None) -> None:
        for stmt in stmts:
            self.walk(stmt, scope, cls)

    def walk(self, root, scope: FunctionScope, cls: str | None) -> None:
        """Visit `root` as code run by `scope`; `cls` is the class whose body we are in, if any.

        Nodes are visited in source order (depth first, parents first) from a stack rather than by
        recursion, which on a large file is most of what the facts cost."""
        stack = [root]
        pop, append, extend = stack.pop, stack.append, stack.extend
        refs, spans, site_at, get, bound = scope.refs, self.spans, self.site_at, _KINDS.get, self.bound
        while stack:
            node = pop()
            kind = type(node)
            if kind is _Name:  # the most frequent node, a leaf; only a name a def or import binds can name a function
                if node.id in bound and type(node.ctx) is _Load:
                    key = (node.id, site_at(node) if spans else None)
                    if key not in refs:
                        refs[key] = node.lineno
                continue
            entry = get(kind)
            if entry is None:
                if node is None:
                    continue  # a dict display's `**mapping` key
                entry = _kind(kind)
            special, fields = entry
            if special is not None:
                if special is _CALL:
                    self.call(node, scope)
                elif special is _ATTRIBUTE:
                    value = node.value
                    if type(node.ctx) is _Load and type(value) is _Name and value.id == "self":
                        # `self.method` read without a call: a bound method passed on or stored.
                        target = ("self", node.attr)
                        site = site_at(node) if spans else None
                        if (target, site) not in scope.edges:
                            scope.edges[(target, site)] = Edge(target, node.lineno, site, call=False)
                        continue
                elif special is _FUNCTION:
                    self.function(node, scope, cls)
                    continue
                elif special is _CLASS:
                    self.class_def(node, scope, cls)
                    continue
                elif special is _ASSIGN:
                    if kind is ast.Assign:
                        self.assign(node.targets, node.value, None, scope, cls)
                    else:
                        self.assign([node.target], node.value, node.annotation, scope, cls)
                    continue
                elif special is _IMPORT:
                    self.add_import(node)
                    continue
                elif special is _WITH:
                    self.bracket(node)
                elif special is _RETURN and node.value is not None and scope.returned is None:
                    value = node.value
                    while isinstance(value, ast.Subscript):
                        value = value.value  # `return self.runners[step]`: an element of what `runners` holds
                    scope.returned = self.value_types(value, scope)
            # Children pushed last field first, each list backwards, so that they pop in source order.
            for name in fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    extend(value[::-1])
                elif isinstance(value, _AST):
                    append(value)

    def bracket(self, node) -> None:
        """A `with` holding a canary-named item: what runs inside it (the later items and the body)
        runs under a canary context."""
        for item in node.items:
            expr = item.context_expr
            if isinstance(expr, ast.Name) and (expr.id in self.brackets or CANARY_CONTEXT.match(expr.id)):
                self.spans.append((
                    f"`with {expr.id}`", (expr.lineno, expr.col_offset), (node.end_lineno, node.end_col_offset),
                ))
                return

    def function(self, node, parent: FunctionScope, cls: str | None) -> None:
        for decorator in node.decorator_list:
            self.walk(decorator, parent, cls)
        for default in (*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
            self.walk(default, parent, cls)
        if cls is not None:
            qualname, owner = f"{cls}.{node.name}", cls
        elif parent.qualname == MODULE:
            qualname, owner = node.name, None
        else:
            qualname, owner = f"{parent.qualname}.<locals>.{node.name}", None
            parent.nested[node.name] = qualname
        scope = FunctionScope(qualname, owner, node.lineno, parent if cls is None and parent.qualname != MODULE else None)
        scope.returns = tuple(("q", t) for t in self.annotation_types(node.returns))
        args = node.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is None:
                continue
            types = self.annotation_types(arg.annotation)
            if types:
                scope.types[arg.arg] = tuple(("q", t) for t in types)
                self.names[arg.arg].update(types)
            if arg.arg in self.kv.batch_names or any(t.rpartition(".")[2] in self.kv.batch_types for t in types):
                scope.batches.add(arg.arg)
        if scope.parent is not None:
            scope.batches |= scope.parent.batches
        self.walk_block(node.body, scope, None)
        self.finish(scope)

    def class_def(self, node: ast.ClassDef, scope: FunctionScope, cls: str | None) -> None:
        for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            self.walk(expr, scope, cls)
        qualname = f"{cls}.{node.name}" if cls else node.name
        bases = tuple(self.qualify(d) for b in node.bases if (d := plain_dotted(b)) is not None)
        self.class_attrs[qualname] = defaultdict(set)
        self.walk_block(node.body, scope, qualname)
        self.respell(qualname)
        attrs = self.class_attrs.pop(qualname)
        self.classes.append(ClassRecord(
            qualname, node.lineno, bases, tuple((a, tuple(sorted(t, key=repr))) for a, t in sorted(attrs.items()))
        ))

    def respell(self, cls: str) -> None:
        """Make triggers of the `self....forward(...)` calls of class `cls` that the catalog's patterns name
        under another spelling: in a model runner (a class calling its raw forward) `self` is the model
        runner (`self.model.forward` is `model_runner.model.forward`); an attribute the class assigns a
        model runner taken from an object built with the draft flag (`self.draft_worker.model_runner`,
        `is_draft_worker=True`) is the draft runner the catalog's managers name (`self.draft_runner`)."""
        pending = self.pending.pop(cls, None)
        if not pending:
            return
        spellings = {}
        if cls in self.class_calls_seen:
            spellings["self"] = "model_runner"
        drafts = self.drafts.pop(cls, set()) | self.flagged.pop(cls, set())
        for attribute in drafts:
            for owner in self.draft_owners:
                spellings.setdefault(f"self.{attribute}", owner)
        if not spellings:
            return
        found: dict[str, list[TriggerCall]] = defaultdict(list)
        for qualname, dotted, line, col, site in pending:
            head, _, rest = dotted.rpartition(".")
            for spelled, catalog_name in spellings.items():
                if head == spelled or head.startswith(spelled + "."):
                    name = catalog_name + head[len(spelled):] + "." + rest
                    match = self.triggers[0].match(name)
                    if match is not None:
                        trigger = self.triggers[1][match.lastgroup]
                        if trigger.kind == "forward":
                            found[qualname].append(TriggerCall(dotted, "forward", trigger.what, line, col, site,
                                                               None, ()))
                        break
        if found:
            for index, fn in enumerate(self.defs):
                extra = found.get(fn.qualname)
                if extra:
                    self.defs[index] = fn._replace(triggers=fn.triggers + tuple(extra), kv=True)

    def finish(self, scope: FunctionScope) -> None:
        edges = scope.edges
        for (name, site), line in scope.refs.items():
            target = self.name_target(name, scope)
            if target is not None and (target, site) not in edges and lookup(scope, "types", name) is None:
                edges[(target, site)] = Edge(target, line, site, call=False)
        edges = list(edges.values())
        self.defs.append(DefFacts(
            scope.qualname, scope.cls, scope.line, tuple(edges), tuple(scope.triggers), scope.kv, scope.returns,
            scope.returned or (),
        ))


# The node kinds the walk treats apart from descending into their children.
_CALL, _ATTRIBUTE, _FUNCTION, _CLASS, _ASSIGN, _IMPORT, _WITH, _RETURN = range(8)
_SPECIAL = {
    ast.Call: _CALL, ast.Attribute: _ATTRIBUTE, ast.FunctionDef: _FUNCTION,
    ast.AsyncFunctionDef: _FUNCTION, ast.ClassDef: _CLASS, ast.Assign: _ASSIGN, ast.AnnAssign: _ASSIGN,
    ast.Import: _IMPORT, ast.ImportFrom: _IMPORT, ast.With: _WITH, ast.AsyncWith: _WITH, ast.Return: _RETURN,
}  # and ast.Name, tested first
_AST, _Load, _Name = ast.AST, ast.Load, ast.Name
# Fields the walk never descends into: annotations run no call; operators (`op`, `ops`) are markers
# with no fields; the rest never hold a node.
_SKIPPED_FIELDS = SCALAR_FIELDS | {"annotation", "returns", "type_params", "op", "ops"}
_LEAVES = (ast.Constant, ast.Global, ast.Nonlocal, getattr(ast, "MatchSingleton", ast.Constant))
_KINDS: dict[type, tuple[int | None, tuple[str, ...]]] = {}  # kind -> (how it is treated, child fields last first)


def _kind(kind: type) -> tuple[int | None, tuple[str, ...]]:
    """How the walk treats a node kind: its special treatment (None: none) and the child fields it
    visits, last first: not `ctx` (Load/Store), annotations or operators."""
    fields = () if kind in _LEAVES else tuple(f for f in kind._fields if f not in _SKIPPED_FIELDS)
    entry = _KINDS[kind] = (_SPECIAL.get(kind), fields[::-1])
    return entry


def _names_bound(tree: ast.Module) -> set[str]:
    """Every name a `def` or an import binds anywhere in the file: what a name read can resolve to
    (`name_target`: a nested function, an import, a top-level definition), and more."""
    found = set()
    for node in statements(tree):
        kind = type(node)
        if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            found.add(node.name)
        elif kind is ast.Import or kind is ast.ImportFrom:
            found.update(alias.asname or alias.name.partition(".")[0] for alias in node.names)
    return found


def reach_facts(path: Path, tree: ast.Module, lines: list[str], spans, catalog: Catalog) -> ReachFacts:
    """The facts of one parsed file; `spans` are its located sites' statement spans (`site_spans`)."""
    return _FactsBuilder(Path(path), lines, spans, catalog).build(tree)
