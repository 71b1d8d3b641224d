"""What the code of a class or a function binds, the one model of it the analyses read: a class's
methods, the names its code reads, the calls it makes and the assignments its methods make; the
locals a function binds to dotted values; and `FunctionScope`, the names a function binds as the
reach walk meets its statements. Standard-library `ast` only.
"""

from __future__ import annotations

import ast

from canary_instrument.rewrite.syntax.nodes import FUNCTIONS, dotted_name, refs_and_calls, walk


class ClassScope:
    """A class's syntax facts, each computed once and only when an analysis asks.

    `analysis.reach_records.ClassRecord` stays apart: it is the plain record of a class (bases,
    attribute types) that check's cache keeps, no AST.
    """

    def __init__(self, cls: ast.ClassDef) -> None:
        self.node = cls
        self.methods = {stmt.name: stmt for stmt in cls.body if isinstance(stmt, FUNCTIONS)}
        self._refs: set[str] | None = None
        self._calls: list[str] | None = None
        self._assignments: list[ast.Assign | ast.AnnAssign] | None = None
        self.answers: dict = {}  # the analyses' questions about the class (by question), answered once

    @property
    def refs(self) -> set[str]:
        """Every dotted name the class's code reads or writes (`self.a.b`, `self.a`, `self`), nested classes aside."""
        if self._refs is None:
            self._refs, self._calls = refs_and_calls(self.node.body)
        return self._refs

    @property
    def calls(self) -> list[str]:
        """The dotted name of every call in the class's code, nested classes aside."""
        if self._calls is None:
            self._refs, self._calls = refs_and_calls(self.node.body)
        return self._calls

    @property
    def assignments(self) -> list[ast.Assign | ast.AnnAssign]:
        """Every assignment of a value in the class's methods (nested code included), method by method
        in `ast.walk` order: where the class's attributes get what they hold."""
        if self._assignments is None:
            self._assignments = _assignments(self.methods.values())
        return self._assignments


def _assignments(functions) -> list[ast.Assign | ast.AnnAssign]:
    return [
        node for function in functions for node in walk(function)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
    ]


def built_with_flag(value: ast.AST, flag: str) -> bool:
    """`value` constructs an object with `flag=True` (`ModelRunner(..., is_draft_worker=True)`)."""
    return isinstance(value, ast.Call) and any(
        k.arg == flag and isinstance(k.value, ast.Constant) and k.value.value is True for k in value.keywords
    )


def local_bindings(function) -> list[tuple[str, str]]:
    """(local, dotted value) of every `local = a.b` (a chain without calls) in `function`, in `ast.walk` order."""
    found = []
    for node in walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            if value is not None and "()" not in value:
                found.append((node.targets[0].id, value))
    return found


def local_aliases(function) -> dict[str, str]:
    """Locals assigned a dotted name (`mr = self.model_runner` -> {"mr": "self.model_runner"}), the first
    binding of each."""
    aliases: dict[str, str] = {}
    for name, value in local_bindings(function):
        aliases.setdefault(name, value)
    return aliases


def expand_alias(text: str, aliases: dict[str, str]) -> str:
    """`text` (`mr.canary_manager`) with a leading local alias spelled out (`self.model_runner.canary_manager`)."""
    head, dot, rest = text.partition(".")
    return aliases[head] + dot + rest if head in aliases else text


class FunctionScope:
    """A function as the reach walk meets it: the names it binds (what a local is typed as, the callables
    it aliases, its nested functions, the names that hold a forward batch), looked up through the
    enclosing functions, and the facts the walk gathers in it (call edges, trigger calls, returns).

    Apart from `ClassScope` because the walk fills it statement by statement, in one pass over the
    file, where the site and hook finders ask a finished class on demand.
    """

    __slots__ = ("qualname", "cls", "line", "edges", "triggers", "kv", "types", "aliases", "nested", "refs",
                 "batches", "parent", "returns", "returned")

    def __init__(self, qualname, cls, line, parent):
        self.qualname = qualname
        self.cls = cls
        self.line = line
        self.parent = parent
        self.edges: dict = {}
        self.triggers: list = []  # reach_records.TriggerCall
        self.kv = False
        self.types: dict[str, tuple] = {}  # local name -> ("q", qualified) / ("attr", a) sources
        self.aliases: dict[str, tuple[tuple, str]] = {}  # local name -> (call target, dotted) of a bound callable
        self.nested: dict[str, str] = {}  # nested function name -> its qualname
        self.refs: dict = {}  # (name, site) -> line of a name read that may be a function reference
        self.batches: set[str] = set()
        self.returns: tuple = ()
        self.returned: tuple | None = None
