"""Find the sites, hooks, generated members and stray or unknown canary code of one file.

Standard-library `ast` only, so `check` stays fast. This is the one site-locating logic:
`check` reports from it, and scaffold/apply/revert edit exactly the statements it names
(they map its positions onto libcst nodes).

Sites come from what is there: an assignment `NAME = VALUE` (NAME a catalog placeholder name
or canary-named, `canary*_ctx`) that a later `with` of its block enters, or that is passed to a
call, is a site; VALUE says its state (placeholder, generated wiring, upstream's hand-written
wiring); the shape around it gives its role (rewrite/analysis/roles.py). In a tree with no placeholder
yet, the catalog's location hints say where scaffold puts them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from canary_instrument.catalog import Catalog, Site, call_matches
from canary_instrument.rewrite.analysis.hooks import HookMatch, locate_hooks
from canary_instrument.rewrite.analysis.roles import (
    Context,
    class_manager,
    in_catalog_spelling,
    owner_spellings,
    resolve,
    scoped_manager,
    suggest_entry,
)
from canary_instrument.rewrite.analysis.shapes import ClassFacts, batch_variable, function_model_runner, names_runner
from canary_instrument.rewrite.analysis.sites import (
    MEMBER_MARKER,
    FileAnalysis,
    MemberInfo,
    Problem,
    SiteMatch,
    value_kind,
)
from canary_instrument.rewrite.handwritten import last_name, parse_site
from canary_instrument.rewrite.syntax.blocks import child_blocks, loop_index, walk_blocks
from canary_instrument.rewrite.syntax.calls import call_names, calls_any
from canary_instrument.rewrite.syntax.imports import Imports
from canary_instrument.rewrite.syntax.nodes import (
    CANARY_CONTEXT,
    FUNCTIONS,
    dotted_name,
    first_line,
    iter_calls,
    same_code,
    statements,
)
from canary_instrument.rewrite.syntax.scopes import local_aliases

__all__ = [
    "MEMBER_MARKER", "FileAnalysis", "HookMatch", "Imports", "MemberInfo", "Problem", "SiteMatch",
    "analyse", "call_names", "child_blocks", "dotted_name", "iter_calls", "same_code", "statements",
]


def _is_wrapper(stmt: ast.AST, placeholder: str) -> bool:
    return (
        isinstance(stmt, (ast.With, ast.AsyncWith))
        and len(stmt.items) == 1
        and stmt.items[0].optional_vars is None
        and isinstance(stmt.items[0].context_expr, ast.Name)
        and stmt.items[0].context_expr.id == placeholder
    )


def _item_names(with_stmt: ast.AST) -> list[str]:
    return [
        item.context_expr.id for item in with_stmt.items
        if isinstance(item.context_expr, ast.Name) and item.optional_vars is None
    ]


def _assigned_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _locate_wrap(site: Site, method, lines: set[int] = frozenset(), spellings: dict | None = None) -> tuple | None:
    """The deepest block in which one contiguous range of statements holds every call to any of `site.calls`
    (and, given `lines`, every call on one of those lines); `spellings`: the class's own names of the
    catalog's owners (`roles.owner_spellings`)."""
    targets = {
        id(call) for stmt in method.body for call in iter_calls(stmt)
        if (name := dotted_name(call.func)) is not None
        and any(call_matches(in_catalog_spelling((name,), spellings or {})[0], p) for p in site.calls)
    }
    if lines and (targets or not site.calls):
        targets |= {
            id(call) for stmt in method.body for call in iter_calls(stmt)
            if any(call.lineno <= line <= (call.end_lineno or call.lineno) for line in lines)
        }
    if not targets:
        return None
    best = None
    # Blocks come parents first; a later block that still holds every target is nested in the
    # previous one, so the last one found is the deepest.
    for block, owner, loops in walk_blocks(method.body):
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
    for block, owner, loops in walk_blocks(method.body):
        for stmt in block:
            if isinstance(stmt, (ast.With, ast.AsyncWith)) and all(calls_any(stmt, (p,)) for p in site.calls):
                if best is None or _contains(best[3], stmt):
                    best = (block, owner, loops, stmt, stmt)
    return best


def locate_role(function, cls, catalog: Catalog, imports: Imports, on_path: set[int], named: bool = True):
    """(role, first line, last line) of a site scaffold can place in `function` (of class `cls`, None at module
    level) around the lines `on_path`: a role that locates there and that the shape of the guarded code
    resolves to, as it will once the placeholder is there; None when no role does. `named`: only roles that
    name the calls they guard, else only those that name none."""
    facts = ClassFacts(cls) if cls is not None else None
    runner = function_model_runner(function, catalog.model_runner) if cls is None else None
    spellings = owner_spellings(facts, catalog) if facts is not None else {}
    aliases = local_aliases(function)
    for site in catalog.sites:
        if site.shape == "argument" or bool(site.calls) != named:
            continue  # an argument is handed to a call that must take it: nothing scaffold can add
        found = (_locate_wrap(site, function, on_path, spellings) if site.shape == "wrap"
                 else _locate_with_item(site, function))
        if found is None:
            continue
        block, _, loops, first, last = found
        start, end = first_line(first), last.end_lineno or last.lineno
        index = loop_index(loops)
        if not any(start <= line <= end for line in on_path) or (site.loop and index is None):
            continue
        # What the site will guard: the `with` a with-item joins, or the statements a wrap puts in its block.
        statements = [first] if site.shape == "with_item" else block[block.index(first): block.index(last) + 1]
        guarded = [name for stmt in statements for name in call_names(stmt)]
        context = Context(
            usage="with", calls=in_catalog_spelling(guarded, spellings), loop_index=index, facts=facts,
            runner=runner, placeholder=site.placeholder, handwired=None, aliases=aliases,
        )
        resolution = resolve(context, catalog)
        if resolution.site is site and not resolution.rivals:
            return site, start, end
    return None


class _Facts:
    """ClassFacts computed on demand, once per class of the file."""

    def __init__(self) -> None:
        self._facts: dict[int, ClassFacts] = {}

    def __call__(self, cls: ast.ClassDef) -> ClassFacts:
        facts = self._facts.get(id(cls))
        if facts is None:
            facts = self._facts[id(cls)] = ClassFacts(cls)
        return facts


def analyse(path: Path, tree: ast.Module, catalog: Catalog, lines: list[str] | None = None) -> FileAnalysis:
    """Everything check and the transforms need to know about one parsed file."""
    posix = Path(path).as_posix()
    nodes = list(statements(tree))
    imports = Imports(tree, nodes)
    result = FileAnalysis(path=Path(path), tree=tree, imports=imports)
    facts = _Facts()
    classes = [node for node in nodes if isinstance(node, ast.ClassDef)]
    functions = [(None, node) for node in tree.body if isinstance(node, FUNCTIONS)] + [
        (cls, stmt) for cls in classes for stmt in cls.body if isinstance(stmt, FUNCTIONS)
    ]  # functions_of(tree), listed once for the site and hook searches
    names = catalog.placeholder_names

    def canary(name: str) -> bool:
        return name in names or bool(CANARY_CONTEXT.match(name))

    found: list[SiteMatch] = []
    for cls, function in functions:
        found.extend(_discover(result, posix, cls, function, catalog, imports, facts, canary))
    _drop_duplicates(result, found)
    result.sites.extend(found)
    _add_hinted(result, posix, classes, catalog, facts)
    result.hooks = locate_hooks(
        tree, catalog, imports, facts, classes=classes, functions=functions, sites=result.sites, handed=result.handed,
    )
    for hook in catalog.hooks:
        if any(location.matches_path(posix) for location in hook.candidates):
            result.roles_expected.add(hook.role)
    _collect_members(result, catalog, lines, facts)
    return result


def _usage(rest: list[ast.stmt], name: str):
    """How the statements after an assignment use its name: ("with", with) or ("argument", call, statement)."""
    for stmt in rest:
        if isinstance(stmt, (ast.With, ast.AsyncWith)) and name in _item_names(stmt):
            return "with", stmt, stmt
        for call in iter_calls(stmt, into_functions=True):
            values = [*call.args, *(k.value for k in call.keywords)]
            if any(isinstance(v, ast.Name) and v.id == name for v in values):
                return "argument", call, stmt
        if _assigned_name(stmt) == name:
            return "reassigned", stmt, stmt
    return None


def _receiver(call: ast.Call) -> list[str]:
    """The dotted name of the function a call runs (the wrapped one for `functools.partial(f, ...)`)."""
    if last_name(call.func) == "partial" and call.args:
        name = dotted_name(call.args[0])
    else:
        name = dotted_name(call.func)
    return [name] if name is not None else []


def _hinted(posix: str, cls, function, catalog: Catalog) -> frozenset[str]:
    """The roles whose location hints name this file, class and method."""
    return frozenset(
        site.role for site in catalog.sites for location in site.candidates
        if location.matches_path(posix) and cls is not None and location.matches_class(cls.name)
        and location.matches_method(function.name)
    )


def _discover(result, posix, cls, function, catalog: Catalog, imports: Imports, facts, canary) -> list[SiteMatch]:
    sites: list[SiteMatch] = []
    claimed: set[int] = set()
    aliases = None
    runner = None
    for block, _, loops in walk_blocks(function.body):
        for index, stmt in enumerate(block):
            name = _assigned_name(stmt)
            if name is None or not canary(name):
                continue
            kind = value_kind(stmt.value, imports, catalog)
            usage = _usage(block[index + 1:], name)
            if usage is None or usage[0] == "reassigned":
                if kind != "other":
                    problem = "stray" if usage is None else "duplicated"
                    result.problems.append(Problem(stmt, problem, name, "no `with` or call after it uses it"))
                continue
            how, node, holder = usage
            if aliases is None:
                aliases = local_aliases(function)
                runner = function_model_runner(function, catalog.model_runner) if cls is None else None
                spellings = owner_spellings(facts(cls), catalog) if cls is not None else {}
            handwired = (
                parse_site(stmt.value, imports.resolve, catalog.placeholder_factory, catalog.null_contexts)
                if kind == "handwritten" else None
            )
            context = Context(
                usage=how,
                calls=in_catalog_spelling(call_names(node) if how == "with" else _receiver(node), spellings),
                loop_index=loop_index(loops),
                facts=facts(cls) if cls is not None else None,
                runner=runner,
                placeholder=name,
                handwired=handwired,
                aliases=aliases,
                hinted=_hinted(posix, cls, function, catalog),
            )
            resolution = resolve(context, catalog)
            if how == "with":
                claimed.add(id(node))
            if resolution.site is None:
                if kind == "handwritten":
                    entry = suggest_entry(context, catalog, function.name)
                    result.problems.append(Problem(stmt, "unknown", name, entry))
                elif kind != "other":
                    result.problems.append(Problem(stmt, "stray", name, "outside every catalogued site"))
                    if how == "with":
                        result.problems.append(Problem(node, "stray", name, "outside every catalogued site"))
                continue
            if resolution.rivals:
                roles = ", ".join(site.role for site in (resolution.site, *resolution.rivals))
                result.problems.append(Problem(stmt, "ambiguous", name, roles))
                continue
            site = resolution.site
            manager = catalog.managers[site.manager]
            manager = scoped_manager(manager, runner) if cls is None else class_manager(manager, facts(cls), catalog)
            sites.append(SiteMatch(
                site=site, location=None, class_node=cls, method=function, block=block, first=holder, last=holder,
                manager=manager, member=catalog.member, loop_index=context.loop_index,
                wrapper=node if how == "with" else None, wrapper_block=block, assign=stmt,
                state=kind, handwired=handwired, usage=how, placeholder=name, batch=_batch(site, function, catalog),
            ))
    for block, _, _ in walk_blocks(function.body):
        for stmt in block:
            if isinstance(stmt, (ast.With, ast.AsyncWith)) and id(stmt) not in claimed:
                name = next((n for n in _item_names(stmt) if canary(n)), None)
                if name is not None:
                    result.problems.append(Problem(stmt, "incomplete", name, "used but never assigned"))
    return sites


def _drop_duplicates(result: FileAnalysis, found: list[SiteMatch]) -> None:
    """Two sites of one role in one function: the first is the site, the second a duplicate (CI104)."""
    keep: dict[tuple[int, str], SiteMatch] = {}
    for match in sorted(found, key=lambda m: m.assign.lineno):
        key = (id(match.method), match.site.role)
        if key in keep:
            result.problems.append(Problem(match.assign, "duplicated", match.placeholder))
        else:
            keep[key] = match
    found[:] = [m for m in found if keep.get((id(m.method), m.site.role)) is m]


def _add_hinted(result: FileAnalysis, posix: str, classes, catalog: Catalog, facts) -> None:
    """Sites the location hints name that hold no placeholder yet (scaffold's work; check's CI101)."""
    taken = {(id(m.method), m.site.role) for m in result.sites} | {
        (id(m.method), m.placeholder) for m in result.sites
    }
    incomplete = {id(p.node) for p in result.problems if p.kind == "incomplete"}
    located: set[tuple[str, int]] = set()
    for site in catalog.sites:
        if site.shape == "argument":
            continue
        for location in site.candidates:
            if not location.matches_path(posix):
                continue
            result.roles_expected.add(site.role)
            for cls in classes:
                if not location.matches_class(cls.name):
                    continue
                for method in cls.body:
                    if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    if not location.matches_method(method.name) or (site.role, id(method)) in located:
                        continue
                    if (id(method), site.role) in taken or (id(method), site.placeholder) in taken:
                        continue
                    found = (_locate_wrap(site, method, set(location.lines), owner_spellings(facts(cls), catalog))
                             if site.shape == "wrap" else _locate_with_item(site, method))
                    if found is None:
                        continue
                    block, owner, loops, first, last = found
                    index = loop_index(loops)
                    if site.loop and index is None:
                        continue
                    wrapper = owner if site.shape == "wrap" and owner is not None and _is_wrapper(
                        owner, site.placeholder) else (first if site.shape == "with_item" and site.placeholder in
                                                       _item_names(first) else None)
                    if wrapper is not None and id(wrapper) in incomplete:
                        result.roles_reported.add(site.role)
                        continue  # reported as a placeholder used but never assigned (not as not found)
                    located.add((site.role, id(method)))
                    manager = class_manager(catalog.managers[location.manager or site.manager], facts(cls), catalog)
                    result.sites.append(SiteMatch(
                        site=site, location=location, class_node=cls, method=method, block=block, first=first,
                        last=last, manager=manager, member=catalog.member, loop_index=index,
                        placeholder=site.placeholder, batch=_batch(site, method, catalog),
                    ))


def _batch(site: Site, function, catalog: Catalog) -> str | None:
    """The function's own name for the forward batch the role's wiring passes by another name."""
    call = ast.parse(site.wiring.replace("{loop_index}", "i"), mode="eval").body
    if not isinstance(call, ast.Call) or not call.args or not isinstance(call.args[0], ast.Name):
        return None
    return batch_variable(function, call.args[0].id, catalog.kv_forward)


def _collect_members(result: FileAnalysis, catalog: Catalog, lines, facts) -> None:
    members: dict[int, MemberInfo] = {}
    for match in result.sites:
        if match.class_node is None:
            continue
        info = members.get(id(match.class_node))
        if info is None:
            members[id(match.class_node)] = MemberInfo(match.class_node, match.manager)
        elif info.manager.name != match.manager.name:
            result.manager_conflicts.append((match.class_node, info.manager.name, match.manager.name))
    for info in members.values():
        for stmt in info.class_node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == catalog.member:
                info.node = stmt
                start = first_line(stmt)
                info.generated = lines is not None and start >= 2 and lines[start - 2].strip() == MEMBER_MARKER
        result.members.append(info)
        # An owner the model-runner shape names (`self.model_runner`) may come from a base class elsewhere.
        owner = info.manager.owner
        reached = facts(info.class_node).reaches(owner)
        if not reached and not names_runner(owner.rpartition(".")[2], catalog.model_runner):
            result.unreachable.append(info)


