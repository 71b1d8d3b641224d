"""Statement shapes the site and hook finders read: dotted names, calls, blocks, imports, and who holds a model runner.

Standard-library `ast` only (`check` uses it).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from collections import deque
from fnmatch import fnmatchcase
from functools import lru_cache

from canary_instrument.catalog import ModelRunnerShape, call_matches

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


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


# Fields that never hold a node, left out of the walks below: the ones the walks would only read and
# drop (`ctx`'s Load/Store marker, names, numbers) cost as much as the nodes they look for.
_SCALAR_FIELDS = frozenset(
    ("ctx", "id", "attr", "arg", "asname", "module", "level", "is_async", "conversion", "type_comment", "simple",
     "kind", "tag", "kwd_attrs")
)
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {ast.Constant: (), ast.Global: (), ast.Nonlocal: ()}
_SINGLETON = getattr(ast, "MatchSingleton", None)
if _SINGLETON is not None:
    _CHILD_FIELDS[_SINGLETON] = ()


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that can hold child nodes (a node, or a list of nodes and `None`s)."""
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        fields = _CHILD_FIELDS[kind] = tuple(f for f in kind._fields if f not in _SCALAR_FIELDS)
    return fields


def walk(node: ast.AST):
    """`ast.walk(node)` in the same order, without the `ctx` markers (which no finder looks at), at a
    fraction of its cost: no generator per node, and only the fields that can hold a node are read."""
    queue = deque([node])
    popleft, append, extend = queue.popleft, queue.append, queue.extend
    get = _CHILD_FIELDS.get
    AST = ast.AST
    while queue:
        current = popleft()
        if current is None:
            continue  # a dict display's `**mapping` key
        yield current
        kind = type(current)
        for name in get(kind) or child_fields(kind):
            value = getattr(current, name, None)
            if type(value) is list:
                extend(value)
            elif isinstance(value, AST):
                append(value)


def iter_calls(node: ast.AST, into_functions: bool = False):
    """Every call under `node` that runs when `node` runs (nested defs, lambdas and classes are skipped).

    `into_functions` also enters nested functions and lambdas (a closure handed to a call runs
    with it), never nested classes.
    """
    skip = _CLASS_ONLY if into_functions else _SCOPE_TYPES
    stack = [node]
    pop, append, extend = stack.pop, stack.append, stack.extend
    get = _CHILD_FIELDS.get
    AST, Call = ast.AST, ast.Call
    while stack:
        current = pop()
        kind = type(current)
        if kind in skip or current is None:
            continue
        if kind is Call:
            yield current
        for name in get(kind) or child_fields(kind):
            value = getattr(current, name, None)
            if type(value) is list:
                extend(value)
            elif isinstance(value, AST):
                append(value)


_SCOPE_TYPES = frozenset(SCOPES)
_CLASS_ONLY = frozenset((ast.ClassDef,))


def call_names(node: ast.AST, into_functions: bool = False) -> list[str]:
    return [name for call in iter_calls(node, into_functions) if (name := dotted_name(call.func)) is not None]


@lru_cache(maxsize=None)
def calls_matcher(patterns: tuple[str, ...]):
    """A test of a dotted call name: true when `call_matches` holds for one of `patterns` (one regex,
    not two `fnmatchcase` per pattern: finders test every call of a class)."""
    parts = [fnmatch.translate(p) for pattern in patterns for p in (pattern, "*." + pattern)]
    regex = re.compile("|".join(f"(?:{part})" for part in parts) or "(?!)")
    return lambda name: regex.match(name) is not None


def matched_patterns(names, patterns) -> set[str]:
    """The patterns that at least one of the dotted call names matches."""
    return {pattern for pattern in patterns if any(call_matches(name, pattern) for name in names)}


def calls_any(node: ast.AST, patterns) -> bool:
    return bool(matched_patterns(call_names(node), patterns))


_BLOCK_FIELDS: dict[type, tuple[tuple[str, ...], bool, bool]] = {}  # per node type: block fields, handlers, cases


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in a compound statement."""
    kind = type(stmt)
    shape = _BLOCK_FIELDS.get(kind)
    if shape is None:
        fields = getattr(kind, "_fields", ())
        shape = _BLOCK_FIELDS[kind] = (
            tuple(name for name in ("body", "orelse", "finalbody") if name in fields),
            "handlers" in fields,
            "cases" in fields,
        )
    names, handlers, cases = shape
    if not names and not handlers and not cases:
        return []  # a simple statement (most of them): nothing to look up
    blocks = []
    for name in names:
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    if handlers:
        for handler in stmt.handlers:
            blocks.append(handler.body)
    if cases:
        for case in stmt.cases:
            blocks.append(case.body)
    return blocks


_FOR_TYPES = frozenset((ast.For, ast.AsyncFor))


def walk_blocks(block, loops=(), owner=None):
    """Yield (block, owner statement, enclosing for-loops) for a block and every block nested in it,
    parents first, in source order."""
    stack = [(block, owner, loops)]
    while stack:
        block, owner, loops = stack.pop()
        yield block, owner, loops
        nested = []
        for stmt in block:
            kind = type(stmt)
            if kind in _SCOPE_TYPES:
                continue
            children = child_blocks(stmt)
            if children:
                inner_loops = loops + (stmt,) if kind in _FOR_TYPES else loops
                nested.extend((child, stmt, inner_loops) for child in children)
        stack.extend(reversed(nested))


def block_of(function, stmt) -> list[ast.stmt] | None:
    for block, _, _ in walk_blocks(function.body):
        if any(s is stmt for s in block):
            return block
    return None


def top_statement(function, node) -> ast.stmt | None:
    """The statement of `function.body` (top level) that holds `node`."""
    for stmt in function.body:
        if any(child is node for child in walk(stmt)):
            return stmt
    return None


def loop_index(loops) -> str | None:
    for loop in reversed(loops):
        if isinstance(loop.target, ast.Name):
            return loop.target.id
    return None


def statements(tree: ast.AST):
    """`ast.walk(tree)` restricted to statements (and the except/case clauses that hold some), in the
    same order, without visiting expressions: statements only ever nest in statements, so this is
    exactly the statements `ast.walk` yields, at a fraction of its cost on a large file."""
    queue = deque([tree])
    while queue:
        node = queue.popleft()
        yield node
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                queue.extend(v for v in value if isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case)))


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


def first_statement(function) -> ast.stmt:
    """The first statement after the docstring (the docstring itself when the body is only that)."""
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1]
    return body[0]


class Imports:
    """Local names bound by imports, resolved to qualified names (`cl` -> `contextlib`)."""

    def __init__(self, tree: ast.Module, nodes=None) -> None:
        """`nodes`: `statements(tree)`, when the caller has listed them."""
        self.names: dict[str, str] = {}
        for node in statements(tree) if nodes is None else nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.names[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        qualified = self.names.get(head, head)
        return f"{qualified}.{rest}" if rest else qualified

    def spelling(self, qualified: str) -> str | None:
        """How this file can spell a qualified name with its existing imports, or None."""
        module, _, attribute = qualified.rpartition(".")
        for local, target in sorted(self.names.items()):
            if target == qualified:
                return local
        for local, target in sorted(self.names.items()):
            if target == module:
                return f"{local}.{attribute}"
        return None


def same_code(node: ast.AST, text: str) -> bool:
    """True when an ast statement (or expression) is the code `text` spells, formatting aside."""
    parsed = ast.parse(text)
    other = parsed.body[0] if isinstance(node, ast.stmt) else parsed.body[0].value
    return ast.dump(node) == ast.dump(other)


def local_aliases(function) -> dict[str, str]:
    """Locals assigned a dotted name (`mr = self.model_runner` -> {"mr": "self.model_runner"})."""
    aliases = {}
    for node in walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            if value is not None and "()" not in value:
                aliases.setdefault(node.targets[0].id, value)
    return aliases


def expand_alias(text: str, aliases: dict[str, str]) -> str:
    head, dot, rest = text.partition(".")
    return aliases[head] + dot + rest if head in aliases else text


def names_runner(name: str, shape: ModelRunnerShape) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in shape.names)


def function_model_runner(function, shape: ModelRunnerShape) -> str | None:
    """How a module-level function reaches a model runner: a parameter named or typed like one, else a local."""
    for arg in parameters(function):
        annotation = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else ""
        if names_runner(arg.arg, shape) or any(fnmatchcase(annotation, t) for t in shape.types if annotation):
            return arg.arg
    for node in walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            name = node.targets[0].id
            if value is not None and (names_runner(value.rpartition(".")[2], shape) or names_runner(name, shape)):
                if "()" not in value and value.rpartition(".")[2] != value:
                    return name
    return None


def _fragments(pattern: str) -> list[str]:
    """The runs of identifier characters that every name matching a shell-style `pattern` holds
    (`*capture_*_graph` -> capture_, _graph); a bracket expression stands for one unknown character."""
    return re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "*", pattern))


def may_name(text: str | None, patterns) -> bool:
    """False when `text` (source code) cannot hold a name matching any of `patterns`: some run of
    identifier characters of each pattern is missing from it. True when unsure (no text)."""
    if text is None:
        return True
    return any(all(part in text for part in _fragments(pattern)) for pattern in patterns)


class ClassFacts:
    """What a class refers to and calls, computed once per class and only when a finder asks.

    `text` (the class's source lines) lets a question about names the class never spells be answered
    without walking it: a file's classes are asked about on every hook search, and most cannot matter.
    """

    def __init__(self, cls: ast.ClassDef, text: str | None = None) -> None:
        self.node = cls
        self.text = text
        self.methods = {stmt.name: stmt for stmt in cls.body if isinstance(stmt, FUNCTIONS)}
        self._refs: set[str] | None = None
        self._calls: list[str] | None = None

    @property
    def refs(self) -> set[str]:
        """Every dotted name the class's code reads or writes (`self.a.b`, `self.a`, `self`), nested classes aside."""
        if self._refs is None:
            self._collect()
        return self._refs

    @property
    def calls(self) -> list[str]:
        """The dotted name of every call in the class's code, nested classes aside."""
        if self._calls is None:
            self._collect()
        return self._calls

    def _collect(self) -> None:
        refs: set[str] = set()
        calls: list[str] = []
        stack = list(self.node.body)
        pop, append, extend = stack.pop, stack.append, stack.extend
        get = _CHILD_FIELDS.get
        AST, Attribute, Name, Call, ClassDef = ast.AST, ast.Attribute, ast.Name, ast.Call, ast.ClassDef
        while stack:
            node = pop()
            kind = type(node)
            if kind is ClassDef or node is None:
                continue
            if kind is Attribute:
                # A chain `self.a.b` on a name holds nothing but its prefixes (`self.a`, `self`): add
                # them all here rather than naming each link again from its root.
                parts = []
                root = node
                while type(root) is Attribute:
                    parts.append(root.attr)
                    root = root.value
                if type(root) is Name:
                    name = root.id
                    refs.add(name)
                    for part in reversed(parts):
                        name = f"{name}.{part}"
                        refs.add(name)
                    continue
                name = dotted_name(node)
                if name is not None:
                    refs.add(name)
            elif kind is Name:
                refs.add(node.id)
            elif kind is Call and (name := dotted_name(node.func)) is not None:
                calls.append(name)
            for field_name in get(kind) or child_fields(kind):
                value = getattr(node, field_name, None)
                if type(value) is list:
                    extend(value)
                elif isinstance(value, AST):
                    append(value)
        self._refs = refs
        self._calls = calls

    def reaches(self, owner: str) -> bool:
        """True when the class uses `owner` (`self.model_runner`), so it can reach a manager held there."""
        if owner == "self":
            return True
        if not may_name(self.text, [owner]):
            return False
        return any(ref == owner or ref.startswith(owner + ".") for ref in self.refs)

    def held_as(self, owner: str, shape: ModelRunnerShape, draft_flag: str | None = None) -> str | None:
        """Where the class holds, under a name of its own, the model runner a manager's `owner` names.

        Only for an owner (`self.draft_runner`) the class never uses and whose name the model-runner shape
        does not recognise: the attribute it assigns a model runner (`self.drafter = self.worker.model_runner`,
        `self.drafter = ModelRunner(...)`). Several such attributes are told apart by the one built from an
        object constructed with `draft_flag=True`; None when that leaves no single one.
        """
        if not owner.startswith("self.") or owner.count(".") != 1 or self.reaches(owner):
            return None
        if names_runner(owner[5:], shape):
            return None
        held = self.runner_attributes(shape)
        if len(held) > 1 and draft_flag:
            drafts = self.flagged_attributes(draft_flag)
            held = {name: value for name, value in held.items() if value.split(".")[:2] in drafts}
        return f"self.{next(iter(held))}" if len(held) == 1 else None

    def runner_attributes(self, shape: ModelRunnerShape) -> dict[str, str]:
        """`self.NAME = VALUE` assignments of a model runner: NAME -> VALUE's dotted name (a constructor: its callee)."""
        found: dict[str, str] = {}
        for function in self.methods.values():
            for node in walk(function):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [dotted_name(t) for t in targets]
                value = node.value
                if isinstance(value, ast.Call):
                    callee = dotted_name(value.func) or ""
                    runner = any(fnmatchcase(callee.rpartition(".")[2], t) for t in shape.types)
                    spelled = callee
                else:
                    spelled = dotted_name(value) or ""
                    runner = "." in spelled and names_runner(spelled.rpartition(".")[2], shape)
                for name in names:
                    if runner and name is not None and name.count(".") == 1 and name.startswith("self."):
                        found.setdefault(name[5:], spelled)
        return found

    def flagged_attributes(self, flag: str) -> list[list[str]]:
        """The `self.NAME` attributes (as ["self", NAME]) assigned an object constructed with `flag=True`."""
        found = []
        for function in self.methods.values():
            for node in walk(function):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                    k.arg == flag and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.value.keywords
                ):
                    found += [name.split(".") for t in node.targets if (name := dotted_name(t)) is not None]
        return found

    def refers_to(self, patterns) -> bool:
        if not may_name(self.text, patterns):
            return False
        return any(fnmatchcase(ref, pattern) for ref in self.refs for pattern in patterns)

    def is_model_runner(self, shape: ModelRunnerShape) -> bool:
        """It calls the raw forward, or is named as the model runner type (a runner whose forward moved)."""
        if any(fnmatchcase(self.node.name, pattern) for pattern in shape.types):
            return True
        if not may_name(self.text, shape.class_calls):
            return False
        return any(call_matches(name, pattern) for name in self.calls for pattern in shape.class_calls)

    def held_model_runner(self, shape: ModelRunnerShape) -> str | None:
        """The most used `self....model_runner` chain of a class that holds a model runner, else None."""
        if not may_name(self.text, shape.names):
            return None
        counts: dict[str, int] = {}
        for ref in self.refs:
            parts = ref.split(".")
            for end in range(2, len(parts) + 1):
                if parts[0] == "self" and names_runner(parts[end - 1], shape):
                    chain = ".".join(parts[:end])
                    counts[chain] = counts.get(chain, 0) + 1
                    break
        if not counts:
            return None
        # refs is a set, so count how many distinct references pass through each chain.
        return max(sorted(counts), key=lambda chain: (counts[chain], -len(chain)))
