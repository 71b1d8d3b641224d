"""Statement shapes the site and hook finders read: dotted names, calls, blocks, imports, and who holds a model runner.

Standard-library `ast` only (`check` uses it).
"""

from __future__ import annotations

import ast
from collections import deque
from fnmatch import fnmatchcase

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


def iter_calls(node: ast.AST, into_functions: bool = False):
    """Every call under `node` that runs when `node` runs (nested defs, lambdas and classes are skipped).

    `into_functions` also enters nested functions and lambdas (a closure handed to a call runs
    with it), never nested classes.
    """
    skip = (ast.ClassDef,) if into_functions else SCOPES
    if isinstance(node, skip):
        return
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, skip):
                stack.append(child)


def call_names(node: ast.AST, into_functions: bool = False) -> list[str]:
    return [name for call in iter_calls(node, into_functions) if (name := dotted_name(call.func)) is not None]


def matched_patterns(names, patterns) -> set[str]:
    """The patterns that at least one of the dotted call names matches."""
    return {pattern for pattern in patterns if any(call_matches(name, pattern) for name in names)}


def calls_any(node: ast.AST, patterns) -> bool:
    return bool(matched_patterns(call_names(node), patterns))


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in a compound statement."""
    blocks = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(stmt, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            blocks.append(block)
    for handler in getattr(stmt, "handlers", ()):
        blocks.append(handler.body)
    for case in getattr(stmt, "cases", ()):
        blocks.append(case.body)
    return blocks


def walk_blocks(block, loops=(), owner=None):
    """Yield (block, owner statement, enclosing for-loops) for a block and every block nested in it."""
    yield block, owner, loops
    for stmt in block:
        if isinstance(stmt, SCOPES):
            continue
        inner_loops = loops + (stmt,) if isinstance(stmt, (ast.For, ast.AsyncFor)) else loops
        for child in child_blocks(stmt):
            yield from walk_blocks(child, inner_loops, stmt)


def block_of(function, stmt) -> list[ast.stmt] | None:
    for block, _, _ in walk_blocks(function.body):
        if any(s is stmt for s in block):
            return block
    return None


def top_statement(function, node) -> ast.stmt | None:
    """The statement of `function.body` (top level) that holds `node`."""
    for stmt in function.body:
        if any(child is node for child in ast.walk(stmt)):
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

    def __init__(self, tree: ast.Module) -> None:
        self.names: dict[str, str] = {}
        for node in statements(tree):
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
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            if value is not None and "()" not in value:
                aliases.setdefault(node.targets[0].id, value)
    return aliases


def expand_alias(text: str, aliases: dict[str, str]) -> str:
    head, dot, rest = text.partition(".")
    return aliases[head] + dot + rest if head in aliases else text


def _names_runner(name: str, shape: ModelRunnerShape) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in shape.names)


def function_model_runner(function, shape: ModelRunnerShape) -> str | None:
    """How a module-level function reaches a model runner: a parameter named or typed like one, else a local."""
    for arg in parameters(function):
        annotation = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else ""
        if _names_runner(arg.arg, shape) or any(fnmatchcase(annotation, t) for t in shape.types if annotation):
            return arg.arg
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            name = node.targets[0].id
            if value is not None and (_names_runner(value.rpartition(".")[2], shape) or _names_runner(name, shape)):
                if "()" not in value and value.rpartition(".")[2] != value:
                    return name
    return None


class ClassFacts:
    """What a class refers to and calls, computed once per class and only when a finder asks."""

    def __init__(self, cls: ast.ClassDef) -> None:
        self.node = cls
        refs: set[str] = set()
        calls: list[str] = []
        stack = list(cls.body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.ClassDef):
                continue
            if isinstance(node, (ast.Attribute, ast.Name)):
                name = dotted_name(node)
                if name is not None:
                    refs.add(name)
            if isinstance(node, ast.Call) and (name := dotted_name(node.func)) is not None:
                calls.append(name)
            stack.extend(ast.iter_child_nodes(node))
        self.refs = refs
        self.calls = calls
        self.methods = {stmt.name: stmt for stmt in cls.body if isinstance(stmt, FUNCTIONS)}

    def reaches(self, owner: str) -> bool:
        """True when the class uses `owner` (`self.model_runner`), so it can reach a manager held there."""
        if owner == "self":
            return True
        return any(ref == owner or ref.startswith(owner + ".") for ref in self.refs)

    def refers_to(self, patterns) -> bool:
        return any(fnmatchcase(ref, pattern) for ref in self.refs for pattern in patterns)

    def is_model_runner(self, shape: ModelRunnerShape) -> bool:
        """It calls the raw forward, or is named as the model runner type (a runner whose forward moved)."""
        return any(call_matches(name, pattern) for name in self.calls for pattern in shape.class_calls) or any(
            fnmatchcase(self.node.name, pattern) for pattern in shape.types
        )

    def held_model_runner(self, shape: ModelRunnerShape) -> str | None:
        """The most used `self....model_runner` chain of a class that holds a model runner, else None."""
        counts: dict[str, int] = {}
        for ref in self.refs:
            parts = ref.split(".")
            for end in range(2, len(parts) + 1):
                if parts[0] == "self" and _names_runner(parts[end - 1], shape):
                    chain = ".".join(parts[:end])
                    counts[chain] = counts.get(chain, 0) + 1
                    break
        if not counts:
            return None
        # refs is a set, so count how many distinct references pass through each chain.
        return max(sorted(counts), key=lambda chain: (counts[chain], -len(chain)))
