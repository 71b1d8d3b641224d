"""Uncovered forward paths (check's CI301), decided over the whole tree.

`reach_facts` reduces one parsed file to plain data: its classes (bases, attribute types), its
functions (the calls and function references each makes, and which of them sit inside a catalogued
site) and the catalog's trigger calls among them. `uncovered_findings` joins the facts of every
analysed file into one call graph, following calls between files through what the code shows, and
reports each trigger that some path reaches outside every catalogued site.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
import fnmatch
from pathlib import Path
from typing import NamedTuple

from canary_instrument.catalog import Catalog

MODULE = "<module>"  # the pseudo-function holding a file's top-level (and class-body) code
# A `with` on a canary-named variable is a bracket whether or not the catalog locates its site
# (locate's stray rule names the same variables; CI103 reports the uncatalogued ones).
_BRACKET = re.compile(r"canary\w*_ctx\Z")

# Call targets, as plain tuples resolved in the tree pass:
#   ("self", m)              self.m(...): the method of the enclosing class, its bases and overrides
#   ("super", m)             super().m(...)
#   ("attr", a, m, on_self)  <x>.a.m(...): a method m of the classes attribute `a` is known to hold
#   ("var", v, m)            v.m(...) for a local or parameter v of unknown class
#   ("typed", types, m)      v.m(...) for a local or parameter annotated or constructed with `types`
#   ("global", q)            a qualified name (an import, or a function or class of this file)
#   ("def", qualname)        a function nested in the enclosing one, by its qualified name
#   ("ret", t, m, word)      f(...).m(...): m on what the call of target t returns (its return annotation,
#                            or the class it constructs)
#   ("name", m, word)        .m(...) on anything else (`self.runners[i].m`); `word` names the receiver
#                            (`runners`) or is None
# What a receiver holds comes from what the code shows (type sources, below): annotations,
# constructor calls, what a called function returns, an attribute of a typed object. A receiver's name
# only ranks a base class's overrides (naming.receiver_fits); one nothing types reaches nothing.
#
# Type sources (what a local, an attribute or a function's result holds):
#   ("q", qualified)         an instance of the class so named (annotation, constructor call)
#   ("attr", a)              what `self.a` holds, in the class of the function asking
#   ("call", t, scope)       what the call of target t returns, t resolved from function `scope`
#   ("get", sources, a)      attribute `a` of what `sources` hold (`capture.decode.runner`)


def _pickled_as_call(cls):
    """Pickle a record as a call of its class with its fields: a file's facts cross a pipe between
    check's two processes, and the default (through copyreg and `__getnewargs__`) takes half as long
    again for the thousands of edges a file holds."""
    cls.__reduce__ = lambda self: (cls, tuple(self))
    return cls


@_pickled_as_call
class Edge(NamedTuple):
    """A call, or a reference to a function that is passed on or stored, inside one function."""

    target: tuple
    line: int
    site: str | None  # role of the catalogued site whose statements hold it
    call: bool = True  # False: a function read without a call (a reference to a class is no edge)


@_pickled_as_call
class TriggerCall(NamedTuple):
    name: str  # dotted name as written (an alias resolved: `fwd = self.model_runner.model.forward`)
    kind: str  # "forward" | "graph"
    what: str
    line: int
    col: int  # 1-based, in characters
    site: str | None
    target: tuple | None  # what the call runs (a graph trigger: the capture or replay method)
    passed: tuple[tuple, ...]  # callables given as arguments (what a capture captures)


@_pickled_as_call
class DefFacts(NamedTuple):
    qualname: str  # `EagerRunner.execute`, `Runner.capture.<locals>.run_once`, or MODULE
    cls: str | None  # qualified name of the class it is a method of
    line: int
    edges: tuple[Edge, ...]
    triggers: tuple[TriggerCall, ...]
    kv: bool  # makes a KV-reading forward call by shape (catalog `kv_forward`)
    returns: tuple[tuple, ...] = ()  # what it returns: its annotation's classes, or `return self.a[...]`/`Foo(...)`
    returned: tuple[tuple, ...] = ()  # what its first `return` hands back, as type sources (preferred when they resolve)


@_pickled_as_call
class ClassFacts(NamedTuple):
    qualname: str
    line: int
    bases: tuple[str, ...]  # qualified names
    attrs: tuple[tuple[str, tuple], ...]  # attribute -> qualified class names it holds, or type sources


@_pickled_as_call
class ReachFacts(NamedTuple):
    """What the tree pass needs to know about one file."""

    module: str  # dotted path of the file (folders and stem), what its own qualified names start with
    classes: tuple[ClassFacts, ...] = ()
    defs: tuple[DefFacts, ...] = ()
    names: tuple[tuple[str, tuple[str, ...]], ...] = ()  # parameter/field name -> annotated classes


def module_name(path: Path) -> str:
    parts = list(Path(path).with_suffix("").parts)
    parts = [p for p in parts if p not in ("/", "", ".", "..") and not p.endswith(":\\")]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def site_spans(analysis) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(role, start, end) of each located site's statements: a wrap site's first..last, a with-item
    site's `with`. Calls inside run under the site's canary context (once it is wired)."""
    spans = []
    for match in analysis.sites:
        first, last = match.first, match.last
        if match.wrapper is not None and getattr(match.wrapper, "end_lineno", None) is not None:
            first = last = match.wrapper
        spans.append((
            match.site.role,
            (first.lineno, first.col_offset),
            (last.end_lineno or last.lineno, last.end_col_offset or 0),
        ))
    return spans


_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class _Scope:
    """A function being reduced to facts."""

    __slots__ = ("qualname", "cls", "line", "edges", "triggers", "kv", "types", "aliases", "nested", "refs",
                 "batches", "parent", "returns", "returned")

    def __init__(self, qualname, cls, line, parent):
        self.qualname = qualname
        self.cls = cls
        self.line = line
        self.parent = parent
        self.edges: dict = {}
        self.triggers: list[TriggerCall] = []
        self.kv = False
        self.types: dict[str, tuple] = {}  # local name -> ("q", qualified) / ("attr", a) sources
        self.aliases: dict[str, tuple[tuple, str]] = {}  # local name -> (call target, dotted) of a bound callable
        self.nested: dict[str, str] = {}  # nested function name -> its qualname
        self.refs: dict = {}  # (name, site) -> line of a name read that may be a function reference
        self.batches: set[str] = set()
        self.returns: tuple = ()
        self.returned: tuple | None = None


class _FactsBuilder:
    def __init__(self, path: Path, lines: list[str], spans, catalog: Catalog) -> None:
        self.module = module_name(path)
        parts = self.module.split(".")
        self.package = parts if Path(path).stem == "__init__" else parts[:-1]
        self.lines = lines
        self.spans = list(spans)
        self.brackets = catalog.placeholder_names
        self.triggers, self.kv_methods = _matchers(catalog)
        self.kv = catalog.kv_forward
        self.imports: dict[str, str] = {}
        self.top_names: set[str] = set()  # functions and classes defined at module level
        self.classes: list[ClassFacts] = []
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
            dotted = _dotted(current)
            if dotted is not None:
                if dotted not in ("None", "Optional", "Union", "typing.Optional", "typing.Union"):
                    out.append(self.qualify(dotted))
                continue
            if isinstance(current, ast.Subscript):
                stack.append(current.slice)
                head = _dotted(current.value)
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
            if isinstance(stmt, _SCOPE_NODES):
                self.top_names.add(stmt.name)
        self.collect_imports(tree)
        module = _Scope(MODULE, None, 1, None)
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
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.imports[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    self.imports.setdefault(top, top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = self.package[: len(self.package) - (node.level - 1)] if node.level > 1 else self.package
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                if alias.name != "*":
                    self.imports[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name

    def walk_block(self, stmts, scope: _Scope, cls: str | None) -> None:
        for stmt in stmts:
            self.walk(stmt, scope, cls)

    def walk(self, root, scope: _Scope, cls: str | None) -> None:
        """Visit `root` as code run by `scope`; `cls` is the class whose body we are in, if any.

        Nodes are visited in source order (depth first, parents first) from a stack rather than by
        recursion, which on a large file is most of what the facts cost."""
        stack = [root]
        pop, append, extend = stack.pop, stack.append, stack.extend
        while stack:
            node = pop()
            kind = type(node)
            special = _SPECIAL.get(kind)
            if special is not None:
                if special is _CALL:
                    self.call(node, scope)
                elif special is _NAME:
                    if type(node.ctx) is _Load:
                        key = (node.id, self.site_at(node) if self.spans else None)
                        if key not in scope.refs:
                            scope.refs[key] = node.lineno
                    continue
                elif special is _ATTRIBUTE:
                    value = node.value
                    if type(node.ctx) is _Load and type(value) is _Name and value.id == "self":
                        # `self.method` read without a call: a bound method passed on or stored.
                        target = ("self", node.attr)
                        site = self.site_at(node) if self.spans else None
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
            elif node is None:
                continue  # a dict display's `**mapping` key
            # Children pushed last field first, each list backwards, so that they pop in source order.
            fields = _RFIELDS.get(kind)
            if fields is None:
                _fields(kind)
                fields = _RFIELDS[kind]
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
            if isinstance(expr, ast.Name) and (expr.id in self.brackets or _BRACKET.match(expr.id)):
                self.spans.append((
                    f"`with {expr.id}`", (expr.lineno, expr.col_offset), (node.end_lineno, node.end_col_offset),
                ))
                return

    def function(self, node, parent: _Scope, cls: str | None) -> None:
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
        scope = _Scope(qualname, owner, node.lineno, parent if cls is None and parent.qualname != MODULE else None)
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

    def class_def(self, node: ast.ClassDef, scope: _Scope, cls: str | None) -> None:
        for expr in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            self.walk(expr, scope, cls)
        qualname = f"{cls}.{node.name}" if cls else node.name
        bases = tuple(self.qualify(d) for b in node.bases if (d := _dotted(b)) is not None)
        self.class_attrs[qualname] = defaultdict(set)
        self.walk_block(node.body, scope, qualname)
        self.respell(qualname)
        attrs = self.class_attrs.pop(qualname)
        self.classes.append(ClassFacts(
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

    def finish(self, scope: _Scope) -> None:
        edges = scope.edges
        for (name, site), line in scope.refs.items():
            target = self.name_target(name, scope)
            if target is not None and (target, site) not in edges and _lookup(scope, "types", name) is None:
                edges[(target, site)] = Edge(target, line, site, call=False)
        edges = list(edges.values())
        self.defs.append(DefFacts(
            scope.qualname, scope.cls, scope.line, tuple(edges), tuple(scope.triggers), scope.kv, scope.returns,
            scope.returned or (),
        ))

    # -- statements and calls -------------------------------------------------------------------------
    def assign(self, targets, value, annotation, scope: _Scope, cls: str | None) -> None:
        types = self.annotation_types(annotation)
        sources: tuple = tuple(("q", t) for t in types)
        alias = None
        if value is not None:
            self.walk(value, scope, cls)
            if not sources:
                sources = self.value_types(value, scope)
            dotted = _dotted(value)
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
        if isinstance(value, ast.Call) and any(
            k.arg == self.draft_flag and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in value.keywords
        ):
            self.flagged[cls].add(attribute)
            return
        dotted = _dotted(value)
        if dotted is not None and dotted.startswith("self."):
            parts = dotted.split(".")
            if len(parts) >= 3 and parts[1] in self.flagged.get(cls, ()):
                self.drafts[cls].add(attribute)

    def value_types(self, value, scope: _Scope) -> tuple:
        """The type sources of what an expression evaluates to (empty: the code does not show it)."""
        kind = type(value)
        if kind is ast.Call:
            dotted = _dotted(value.func)
            if dotted is not None and dotted.rpartition(".")[2][:1].isupper():
                head = dotted.partition(".")[0]
                if head not in scope.types and head != "self":
                    return (("q", self.qualify(dotted)),)
            target = self.call_target(value.func, scope)
            return (("call", target, scope.qualname),) if target is not None else ()
        if kind is ast.Name:
            return _lookup(scope, "types", value.id) or ()
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

    def name_target(self, name: str, scope: _Scope) -> tuple | None:
        current = scope
        while current is not None:
            if name in current.nested:
                return ("def", current.nested[name])
            current = current.parent
        if name in self.imports or name in self.top_names:
            return ("global", self.qualify(name))
        return None

    def call_target(self, func, scope: _Scope) -> tuple | None:
        if isinstance(func, ast.Name):
            alias = _lookup(scope, "aliases", func.id)
            if alias is not None:
                return alias[0]
            types = _lookup(scope, "types", func.id)
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
            types = _lookup(scope, "types", receiver.id)
            if types is not None:
                return ("typed", types, method)
            if receiver.id in self.imports or receiver.id in self.top_names:
                dotted = _dotted(func)
                return ("global", self.qualify(dotted)) if dotted else None
            return ("var", receiver.id, method)
        if isinstance(receiver, ast.Attribute):
            dotted = _dotted(receiver)
            if dotted is not None:
                head = dotted.partition(".")[0]
                if head != "self" and _lookup(scope, "types", head) is None and head in (self.imports.keys() | self.top_names):
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

    def call(self, node: ast.Call, scope: _Scope) -> None:
        func = node.func
        target = self.call_target(func, scope)
        site = self.site_at(node) if self.spans else None
        dotted = _dotted(func)
        if isinstance(func, ast.Name) and (alias := _lookup(scope, "aliases", func.id)) is not None:
            dotted = alias[1]
        final = dotted.rpartition(".")[2] if dotted else None
        trigger = None
        if dotted is not None and (match := self.triggers[0].match(dotted)) is not None:
            trigger = self.triggers[1][match.lastgroup]
        # A KV-reading forward is where a path ends: its callee (the model) is not followed.
        if target is not None and (target, site) not in scope.edges and (trigger is None or trigger.kind != "forward"):
            scope.edges[(target, site)] = Edge(target, node.lineno, site)
        owner = _enclosing_class(scope)
        if owner is not None and dotted is not None:
            if final in self.model_calls and dotted == f"self.{final}":
                self.class_calls_seen.add(owner)
            if trigger is None and dotted.startswith("self.") and final is not None and self.kv_methods.match(final):
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
        elif final is not None and not scope.kv and self.kv_methods.match(final):
            if self.takes_batch(node, scope):
                scope.kv = True

    def column(self, node) -> int:
        """A node's 1-based column in characters."""
        if node.lineno - 1 < len(self.lines):
            return len(self.lines[node.lineno - 1].encode("utf-8")[: node.col_offset].decode("utf-8", "replace")) + 1
        return node.col_offset + 1

    def takes_batch(self, node: ast.Call, scope: _Scope) -> bool:
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


# The node kinds the walk treats apart from descending into their children.
_CALL, _NAME, _ATTRIBUTE, _FUNCTION, _CLASS, _ASSIGN, _IMPORT, _WITH, _RETURN = range(9)
_SPECIAL = {
    ast.Call: _CALL, ast.Name: _NAME, ast.Attribute: _ATTRIBUTE, ast.FunctionDef: _FUNCTION,
    ast.AsyncFunctionDef: _FUNCTION, ast.ClassDef: _CLASS, ast.Assign: _ASSIGN, ast.AnnAssign: _ASSIGN,
    ast.Import: _IMPORT, ast.ImportFrom: _IMPORT, ast.With: _WITH, ast.AsyncWith: _WITH, ast.Return: _RETURN,
}
_AST, _Load, _Name = ast.AST, ast.Load, ast.Name
# Fields the walk never descends into: annotations run no call; the rest never hold a node.
_SKIPPED_FIELDS = frozenset(("ctx", "annotation", "returns", "type_comment", "type_params", "id", "attr", "arg",
                             "asname", "module", "level", "is_async", "conversion", "simple", "kind", "tag",
                             "kwd_attrs"))
_FIELDS: dict[type, tuple[str, ...]] = {ast.Constant: (), ast.Global: (), ast.Nonlocal: ()}  # (names: strings)
_RFIELDS: dict[type, tuple[str, ...]] = {}  # the same, last first


def _fields(kind: type) -> tuple[str, ...]:
    """The child fields the walk visits: not `ctx` (Load/Store) nor annotations, which run no call."""
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(f for f in kind._fields if f not in _SKIPPED_FIELDS)
    _RFIELDS.setdefault(kind, fields[::-1])
    return fields


_MATCHERS: list = [None, None]  # [catalog, its matchers]: built once per catalog, not once per file


def _matchers(catalog: Catalog) -> tuple[tuple[re.Pattern, dict[str, object]], re.Pattern]:
    """The trigger matchers and the KV-forward method regex of `catalog`."""
    if _MATCHERS[0] is not catalog:
        methods = re.compile("|".join(fnmatch.translate(m) for m in catalog.kv_forward.methods) or "(?!)")
        _MATCHERS[:] = [catalog, (_trigger_matchers(catalog), methods)]
    return _MATCHERS[1]


def _trigger_matchers(catalog: Catalog) -> tuple[re.Pattern, dict[str, object]]:
    """One regex for `call_matches` over every trigger's patterns (tried once per call), a named group
    per trigger, and the triggers by group name: the first trigger in catalog order whose patterns
    match is the group that matches (alternatives are tried in order, each to the end of the name)."""
    groups = []
    by_group = {}
    for index, trigger in enumerate(catalog.triggers):
        parts = [fnmatch.translate(p) for pattern in trigger.calls for p in (pattern, "*." + pattern)]
        groups.append(f"(?P<t{index}>{'|'.join(f'(?:{part})' for part in parts)})")
        by_group[f"t{index}"] = trigger
    return re.compile("|".join(groups) or "(?!)"), by_group


def _lookup(scope: _Scope, table: str, name: str):
    """A local's entry in `table`, looked up through the enclosing functions (closures)."""
    while scope is not None:
        value = getattr(scope, table).get(name)
        if value is not None:
            return value
        scope = scope.parent
    return None


def _enclosing_class(scope: _Scope) -> str | None:
    while scope is not None:
        if scope.cls is not None:
            return scope.cls
        scope = scope.parent
    return None


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def reach_facts(path: Path, tree: ast.Module, lines: list[str], spans, catalog: Catalog) -> ReachFacts:
    """The facts of one parsed file; `spans` are its located sites' statement spans (`site_spans`)."""
    return _FactsBuilder(Path(path), lines, spans, catalog).build(tree)
