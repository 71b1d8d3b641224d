"""Syntax facts of one parsed file that every analysis reads: dotted names, walks over the tree,
statements, functions and their parameters, and character positions. Standard-library `ast` only.
"""

from __future__ import annotations

import ast
import re
from collections import deque

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPE_TYPES = frozenset(SCOPES)
# A variable named like a canary context (`canary_ctx`, `canary_index_ctx`): the spelling of wiring,
# whether or not the catalog locates its site. The prefilter searches the same pattern in bytes.
CANARY_CONTEXT_PATTERN = r"canary\w*_ctx"
CANARY_CONTEXT = re.compile(CANARY_CONTEXT_PATTERN + r"\Z")


def dotted_name(node: ast.AST) -> str | None:
    """`self.a.b` for an attribute chain; a chain rooted in a call reads `f().b`; else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        inner = dotted_name(node.func)
        if inner is None:
            return None
        parts.append(inner + "()")
    else:
        return None
    return ".".join(reversed(parts))


def plain_dotted(node) -> str | None:
    """`a.b.c` for an attribute chain rooted in a name; None for anything else (a call included)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def char_column(line: str, col_offset: int) -> int:
    """The 1-based column in characters of a node whose `col_offset` counts UTF-8 bytes of `line`."""
    return len(line.encode("utf-8")[:col_offset].decode("utf-8", "replace")) + 1


# Fields that never hold a node, left out of the walks below: the ones the walks would only read and
# drop (`ctx`'s Load/Store marker, names, numbers) cost as much as the nodes they look for.
SCALAR_FIELDS = frozenset(
    ("ctx", "id", "attr", "arg", "asname", "module", "level", "is_async", "conversion", "type_comment", "simple",
     "kind", "tag", "kwd_attrs")
)


CHILD_FIELDS: dict[type, tuple[str, ...]] = {ast.Constant: (), ast.Global: (), ast.Nonlocal: ()}


_SINGLETON = getattr(ast, "MatchSingleton", None)
if _SINGLETON is not None:
    CHILD_FIELDS[_SINGLETON] = ()


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that can hold child nodes (a node, or a list of nodes and `None`s)."""
    fields = CHILD_FIELDS.get(kind)
    if fields is None:
        fields = CHILD_FIELDS[kind] = tuple(f for f in kind._fields if f not in SCALAR_FIELDS)
    return fields


def descend(roots, skip: frozenset = frozenset(), breadth_first: bool = False):
    """Every node under `roots` (the roots included), the subtrees of the node types in `skip` left out:
    the one loop every walk of this module runs, reading only the fields that can hold a node (no
    generator per node, no `ctx` markers, which no finder looks at). Breadth first is `ast.walk`'s
    order; depth first takes the last node pushed first."""
    pending = deque(roots)
    take = pending.popleft if breadth_first else pending.pop
    append, extend = pending.append, pending.extend
    get = CHILD_FIELDS.get
    AST = ast.AST
    while pending:
        current = take()
        kind = type(current)
        if kind in skip or current is None:  # None: a dict display's `**mapping` key
            continue
        yield current
        for name in get(kind) or child_fields(kind):
            value = getattr(current, name, None)
            if type(value) is list:
                extend(value)
            elif isinstance(value, AST):
                append(value)


def walk(node: ast.AST):
    """`ast.walk(node)` in the same order, at a fraction of its cost (see `descend`)."""
    return descend((node,), breadth_first=True)


def statements(tree: ast.AST):
    """`ast.walk(tree)` restricted to statements (and the except/case clauses that hold some), in the
    same order, without visiting expressions: statements only ever nest in statements, so this is
    exactly the statements `ast.walk` yields, at a fraction of its cost on a large file."""
    queue = deque([tree])
    pop, extend = queue.popleft, queue.extend
    get = _BLOCK_FIELDS.get
    while queue:
        node = pop()
        yield node
        kind = type(node)
        fields = get(kind)
        if fields is None:
            fields = _BLOCK_FIELDS[kind] = tuple(f for f in kind._fields if f in _BLOCKS)
        for name in fields:
            value = getattr(node, name, None)
            if type(value) is list:
                extend(value)


# The fields of a statement (or of an except or case clause) that hold statements or clauses: every
# item of such a list is one. (`Lambda.body` and `IfExp.body` are expressions, never reached here.)
_BLOCKS = frozenset(("body", "orelse", "finalbody", "handlers", "cases"))
_BLOCK_FIELDS: dict[type, tuple[str, ...]] = {}


def functions_of(tree: ast.Module):
    """(class or None, function) for every method of every class and every module-level function."""
    for node in tree.body:
        if isinstance(node, FUNCTIONS):
            yield None, node
    for node in statements(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, FUNCTIONS):
                    yield node, stmt


def parameters(function) -> list[ast.arg]:
    arguments = function.args
    found = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    found += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return found


def first_line(stmt: ast.stmt) -> int:
    """A statement's first line, its decorators' included."""
    decorators = getattr(stmt, "decorator_list", None)
    return min(stmt.lineno, *(d.lineno for d in decorators)) if decorators else stmt.lineno


def first_statement(function) -> ast.stmt:
    """The first statement after the docstring (the docstring itself when the body is only that)."""
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1]
    return body[0]


def same_code(node: ast.AST, text: str) -> bool:
    """True when an ast statement (or expression) is the code `text` spells, formatting aside."""
    parsed = ast.parse(text)
    other = parsed.body[0] if isinstance(node, ast.stmt) else parsed.body[0].value
    return ast.dump(node) == ast.dump(other)


def iter_calls(node: ast.AST, into_functions: bool = False):
    """Every call under `node` that runs when `node` runs (nested defs, lambdas and classes are skipped).

    `into_functions` also enters nested functions and lambdas (a closure handed to a call runs
    with it), never nested classes.
    """
    Call = ast.Call
    return (n for n in descend((node,), CLASS_ONLY if into_functions else SCOPE_TYPES) if type(n) is Call)


CLASS_ONLY = frozenset((ast.ClassDef,))  # `descend`'s skip set that leaves out only nested classes


def refs_and_calls(body: list[ast.stmt]) -> tuple[set[str], list[str]]:
    """The dotted names a block reads (every prefix of an attribute chain: each link is a node of its
    own) and the dotted names of the calls it makes, in `iter_calls`' order, nested classes aside."""
    refs: set[str] = set()
    calls: list[str] = []
    add = refs.add
    Attribute, Name, Call = ast.Attribute, ast.Name, ast.Call
    for node in descend(body, CLASS_ONLY):
        kind = type(node)
        if kind is Name:
            add(node.id)
        elif kind is Attribute:
            if (name := dotted_name(node)) is not None:
                add(name)
        elif kind is Call and (name := dotted_name(node.func)) is not None:
            calls.append(name)
    return refs, calls
