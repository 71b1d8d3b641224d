"""Find the catalog's sites, hooks, generated members and stray placeholders in one file.

Standard-library `ast` only, so `check` stays fast. This is the one site-locating logic:
`check` reports from it, and scaffold/apply/revert edit exactly the statements it names
(they map its positions onto libcst nodes).
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.catalog import Catalog, Hook, Location, Manager, Site, call_matches

MEMBER_MARKER = "# canary-instrument: generated; `canary-instrument revert` removes it"
_CANARY_NAME = re.compile(r"canary\w*_ctx\Z")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


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


def iter_calls(node: ast.AST):
    """Every call under `node` that runs when `node` runs (nested defs, lambdas and classes are skipped)."""
    if isinstance(node, _SCOPES):
        return
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, _SCOPES):
                stack.append(child)


def calls_any(node: ast.AST, patterns) -> bool:
    return any(
        (name := dotted_name(call.func)) is not None and any(call_matches(name, p) for p in patterns)
        for call in iter_calls(node)
    )


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


def value_kind(value: ast.AST, imports: Imports, catalog: Catalog) -> str:
    """`placeholder` (a call of the placeholder factory), `wired` (`self.<member>(...)`) or `other`."""
    if isinstance(value, ast.Call):
        name = dotted_name(value.func)
        if name is not None:
            if not value.args and not value.keywords and imports.resolve(name) == catalog.placeholder_factory:
                return "placeholder"
            if name == f"self.{catalog.member}":
                return "wired"
    return "other"


@dataclass
class SiteMatch:
    """A located placeholder site and its state: missing, placeholder, wired, other or incomplete."""

    site: Site
    location: Location
    class_node: ast.ClassDef
    method: ast.FunctionDef | ast.AsyncFunctionDef
    block: list[ast.stmt]  # holds first..last (wrap: the statements wrapped; with_item: the with)
    first: ast.stmt
    last: ast.stmt
    loop_index: str | None = None
    wrapper: ast.With | None = None  # the `with <placeholder>:` (wrap) or the with holding the item
    wrapper_block: list[ast.stmt] | None = None
    assign: ast.Assign | None = None
    state: str = "missing"

    @property
    def anchor(self) -> ast.stmt:
        """Where findings about this site point: the assignment, else the wrapper, else the first statement."""
        return self.assign or self.wrapper or self.first

    def wiring(self) -> str:
        return self.site.wiring.replace("{loop_index}", self.loop_index or "")


@dataclass
class HookMatch:
    hook: Hook
    class_node: ast.ClassDef
    method: ast.FunctionDef | ast.AsyncFunctionDef
    anchor: ast.stmt  # the statement the hook goes after
    anchor_block: list[ast.stmt]
    present: list[tuple[ast.stmt, list[ast.stmt]]] = field(default_factory=list)  # (statement, its block)


@dataclass
class MemberInfo:
    class_node: ast.ClassDef
    manager: Manager
    node: ast.FunctionDef | None = None
    generated: bool = False


@dataclass
class Stray:
    node: ast.AST
    name: str
    duplicated: bool  # in a method that holds a site with the same placeholder


@dataclass
class FileAnalysis:
    path: Path
    tree: ast.Module
    imports: Imports
    sites: list[SiteMatch] = field(default_factory=list)
    hooks: list[HookMatch] = field(default_factory=list)
    members: list[MemberInfo] = field(default_factory=list)
    strays: list[Stray] = field(default_factory=list)
    roles_expected: set[str] = field(default_factory=set)  # roles with a candidate at this path
    manager_conflicts: list[tuple[ast.ClassDef, str, str]] = field(default_factory=list)


def _walk_blocks(block, loops=(), owner=None):
    """Yield (block, owner statement, enclosing for-loops) for a block and every block nested in it."""
    yield block, owner, loops
    for stmt in block:
        if isinstance(stmt, _SCOPES):
            continue
        inner_loops = loops + (stmt,) if isinstance(stmt, (ast.For, ast.AsyncFor)) else loops
        for child in child_blocks(stmt):
            yield from _walk_blocks(child, inner_loops, stmt)


def _is_wrapper(stmt: ast.AST, placeholder: str) -> bool:
    return (
        isinstance(stmt, (ast.With, ast.AsyncWith))
        and len(stmt.items) == 1
        and stmt.items[0].optional_vars is None
        and isinstance(stmt.items[0].context_expr, ast.Name)
        and stmt.items[0].context_expr.id == placeholder
    )


def _item_index(with_stmt: ast.AST, placeholder: str) -> int | None:
    for index, item in enumerate(with_stmt.items):
        if isinstance(item.context_expr, ast.Name) and item.context_expr.id == placeholder and item.optional_vars is None:
            return index
    return None


def _assigned_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _loop_index(loops) -> str | None:
    for loop in reversed(loops):
        if isinstance(loop.target, ast.Name):
            return loop.target.id
    return None


def _locate_wrap(site: Site, method) -> tuple | None:
    """The deepest block in which one contiguous range of statements holds every call to any of `site.calls`."""
    targets = {
        id(call) for stmt in method.body for call in iter_calls(stmt)
        if (name := dotted_name(call.func)) is not None and any(call_matches(name, p) for p in site.calls)
    }
    if not targets:
        return None
    best = None
    # Blocks come parents first; a later block that still holds every target is nested in the
    # previous one, so the last one found is the deepest.
    for block, owner, loops in _walk_blocks(method.body):
        hits = []
        found = set()
        for stmt in block:
            inside = {id(call) for call in iter_calls(stmt)} & targets
            if inside:
                hits.append(stmt)
                found |= inside
        if found == targets:
            best = (block, owner, loops, hits[0], hits[-1])
    return best


def _contains(ancestor: ast.AST, node: ast.AST) -> bool:
    return any(child is node for child in ast.walk(ancestor))


def _locate_with_item(site: Site, method) -> tuple | None:
    """The innermost `with` statement whose items or body call every one of `site.calls`."""
    best = None
    for block, owner, loops in _walk_blocks(method.body):
        for stmt in block:
            if isinstance(stmt, (ast.With, ast.AsyncWith)) and all(calls_any(stmt, (p,)) for p in site.calls):
                if best is None or _contains(best[3], stmt):
                    best = (block, owner, loops, stmt, stmt)
    return best


def analyse(path: Path, tree: ast.Module, catalog: Catalog, lines: list[str] | None = None) -> FileAnalysis:
    """Everything check and the transforms need to know about one parsed file."""
    posix = Path(path).as_posix()
    imports = Imports(tree)
    result = FileAnalysis(path=Path(path), tree=tree, imports=imports)
    classes = [node for node in statements(tree) if isinstance(node, ast.ClassDef)]

    def methods_of(cls, location):
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and location.matches_method(stmt.name):
                yield stmt

    members: dict[int, MemberInfo] = {}
    located: set[tuple[str, int]] = set()  # (role, method): overlapping candidates locate a site once
    for site in catalog.sites:
        for location in site.candidates:
            if not location.matches_path(posix):
                continue
            result.roles_expected.add(site.role)
            for cls in classes:
                if not location.matches_class(cls.name):
                    continue
                for method in methods_of(cls, location):
                    if (site.role, id(method)) in located:
                        continue
                    match = _match_site(site, location, cls, method, imports, catalog)
                    if match is None:
                        continue
                    located.add((site.role, id(method)))
                    result.sites.append(match)
                    manager = catalog.managers[location.manager]
                    info = members.get(id(cls))
                    if info is None:
                        members[id(cls)] = MemberInfo(cls, manager)
                    elif info.manager.name != manager.name:
                        result.manager_conflicts.append((cls, info.manager.name, manager.name))

    for hook in catalog.hooks:
        parsed = ast.dump(ast.parse(hook.statement).body[0])
        for location in hook.candidates:
            if not location.matches_path(posix):
                continue
            result.roles_expected.add(hook.role)
            for cls in classes:
                if not location.matches_class(cls.name):
                    continue
                for method in methods_of(cls, location):
                    if (hook.role, id(cls)) in located:
                        continue  # one hook per class: the first candidate method holding the anchor
                    match = _match_hook(hook, parsed, cls, method)
                    if match is not None:
                        located.add((hook.role, id(cls)))
                        result.hooks.append(match)

    for info in members.values():
        for stmt in info.class_node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == catalog.member:
                info.node = stmt
                first_line = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
                info.generated = lines is not None and first_line >= 2 and lines[first_line - 2].strip() == MEMBER_MARKER
        result.members.append(info)

    _find_strays(result, catalog)
    return result


def _match_site(site, location, cls, method, imports, catalog) -> SiteMatch | None:
    found = _locate_wrap(site, method) if site.shape == "wrap" else _locate_with_item(site, method)
    if found is None:
        return None
    block, owner, loops, first, last = found
    loop_index = _loop_index(loops)
    if site.loop and loop_index is None:
        return None
    match = SiteMatch(site, location, cls, method, block, first, last, loop_index)
    if site.shape == "wrap":
        if owner is not None and _is_wrapper(owner, site.placeholder):
            match.wrapper = owner
    elif _item_index(first, site.placeholder) is not None:
        match.wrapper = first
    if match.wrapper is None:
        return match
    match.wrapper_block = _block_of(method, match.wrapper)
    match.state = "incomplete"
    if match.wrapper_block is not None:
        position = next(i for i, stmt in enumerate(match.wrapper_block) if stmt is match.wrapper)
        for stmt in reversed(match.wrapper_block[:position]):
            if _assigned_name(stmt) == site.placeholder:
                match.assign = stmt
                match.state = value_kind(stmt.value, imports, catalog)
                break
    return match


def _block_of(method, stmt) -> list[ast.stmt] | None:
    for block, _, _ in _walk_blocks(method.body):
        if any(s is stmt for s in block):
            return block
    return None


def _match_hook(hook, parsed_dump, cls, method) -> HookMatch | None:
    anchor = None
    present = []
    for block, _, _ in _walk_blocks(method.body):
        for stmt in block:
            if ast.dump(stmt) == parsed_dump:
                present.append((stmt, block))
            elif anchor is None and not child_blocks(stmt) and calls_any(stmt, hook.after_calls):
                anchor = (stmt, block)
    if anchor is None:
        return None
    return HookMatch(hook, cls, method, anchor[0], anchor[1], present)


def _find_strays(result: FileAnalysis, catalog: Catalog) -> None:
    """Canary-named placeholder assignments and with items that no located site accounts for."""
    names = catalog.placeholder_names
    used: set[int] = set()
    sited: dict[int, set[str]] = {}
    for match in result.sites:
        sited.setdefault(id(match.method), set()).add(match.site.placeholder)
        if match.assign is not None:
            used.add(id(match.assign))
        if match.wrapper is not None:
            used.add(id(match.wrapper))

    def canary(name: str) -> bool:
        return name in names or bool(_CANARY_NAME.match(name))

    def visit(node, method):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child)
                continue
            name = None
            if isinstance(child, ast.Assign) and id(child) not in used:
                name = _assigned_name(child)
                if name is not None and (not canary(name) or value_kind(child.value, result.imports, catalog) == "other"):
                    name = None
            elif isinstance(child, (ast.With, ast.AsyncWith)) and id(child) not in used:
                name = next(
                    (item.context_expr.id for item in child.items
                     if isinstance(item.context_expr, ast.Name) and canary(item.context_expr.id)),
                    None,
                )
            if name is not None:
                duplicated = method is not None and name in sited.get(id(method), ())
                result.strays.append(Stray(child, name, duplicated))
            visit(child, method)

    visit(result.tree, None)
