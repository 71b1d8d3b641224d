"""Where scaffold puts a site on a forward path that runs outside every site (what CI301 reports).

Walking back from an uncovered forward along the path of calls that reaches it, the first function
in which a catalog role locates (`locate.locate_role`: the role's calls, loop and class conditions, the
manager its class reaches) around the path's next step gets a site of that role. The role comes from
the shape of the code, as it will when the placeholder is found later; class and method names play
no part. Each placement is taken into the call graph as a bracket before the next uncovered forward
is looked at, so one site covers every path through it (a capture method's warm-up and capture), and
a forward no role can be placed on is returned, for scaffold to report (CI301).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.callgraph import CallGraph, DefKey
from canary_instrument.rewrite.analysis.locate import locate_role
from canary_instrument.rewrite.analysis.reach import MODULE
from canary_instrument.rewrite.analysis.tree import ParsedFile
from canary_instrument.rewrite.rules.ci301_uncovered_forward import uncovered_paths
from canary_instrument.rewrite.syntax.nodes import FUNCTIONS
from canary_instrument.rewrite.transforms.runner import load


@dataclass(frozen=True)
class Placement:
    """A site to add: role `role` in `cls.method` (cls None: a module-level function) of `path`."""

    path: Path
    cls: str | None
    method: str
    role: str
    lines: tuple[int, ...]  # the lines from which the path goes on: the site must guard them


class _Files:
    """The analysed files' syntax, parsed once each, as a placement needs it."""

    def __init__(self, graph: CallGraph, catalog: Catalog) -> None:
        self.graph = graph
        self.catalog = catalog
        self.parsed: dict[int, ParsedFile] = {}

    def function(self, key: DefKey):
        """(path, imports, class node or None, function node) of a method or module-level function."""
        index, qualname = key
        if index not in self.parsed:
            self.parsed[index] = load(Path(self.graph.files[index][0]), self.catalog)
        parsed = self.parsed[index]
        owner, _, name = qualname.rpartition(".")
        scope = parsed.tree
        cls = None
        if owner:
            cls = next((n for n in parsed.tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
            if cls is None:
                return None
            scope = cls
        function = next((n for n in scope.body if isinstance(n, FUNCTIONS) and n.name == name), None)
        return None if function is None else (parsed.path, parsed.analysis.imports, cls, function)


def plan_cover(graph: CallGraph, catalog: Catalog) -> tuple[list[Placement], list]:
    """Sites that cover the uncovered forwards, and the forwards none could be placed for, each as
    (function key, trigger, path root..key). The uncovered forwards are asked again after each placement,
    which the graph then holds as a bracket."""
    files = _Files(graph, catalog)
    # What entering each role's site opens on its manager: the outside-graph phases, an active sub-forward,
    # or both. The runtime refuses a site that opens what an enclosing one holds open on the same manager. A
    # manager with a guard is off on a draft model runner, so it is the target's; one without is the draft's.
    kinds = {
        site.role: frozenset((bool(catalog.managers[site.manager].guard), kind) for kind in site.evidence)
        for site in catalog.sites
    }
    placements: list[Placement] = []
    unplaced: dict[tuple, tuple] = {}
    while True:
        pending = [item for item in uncovered_paths(graph) if (item[0], item[1].line) not in unplaced]
        if not pending:
            return placements, list(unplaced.values())
        key, trigger, chain = pending[0]
        enclosing = _enclosing(graph, kinds)
        for at, named in _steps(graph, chain):
            found = files.function(chain[at])
            if found is None:
                continue
            path, imports, cls, function = found
            lines_on_path = _next_lines(graph, chain, at, trigger)
            placed = locate_role(function, cls, catalog, imports, lines_on_path, named=named)
            if placed is None or _would_nest(graph, kinds, enclosing, chain[at], *placed):
                continue  # no role fits here, or its site would run inside one of its kind (or one inside it)
            site, first, last = placed
            _bracket(graph, chain[at], first, last, site.role)
            placements.append(Placement(Path(path), cls.name if cls is not None else None, function.name,
                                        site.role, tuple(sorted(lines_on_path))))
            break
        else:
            unplaced[(key, trigger.line)] = (key, trigger, chain)


def _steps(graph: CallGraph, chain: list[DefKey]):
    """(position on the path, whether only roles that name their calls are tried) in the order a site is
    looked for: back from the forward, roles that name what they guard anywhere on the path; then a role
    that names nothing (a start-up forward's) back to the first constructor on the path, if there is one.
    A nested function is skipped: it runs where its enclosing one hands it on, which is on the path too."""
    placeable = [at for at, key in enumerate(chain)
                 if ".<locals>." not in graph.defs[key].qualname and graph.defs[key].qualname != MODULE]
    yield from ((at, True) for at in reversed(placeable))
    constructors = [at for at, key in enumerate(chain) if graph.defs[key].qualname.endswith(".__init__")]
    if constructors:
        yield from ((at, False) for at in reversed(placeable) if at >= constructors[0])


def _enclosing(graph: CallGraph, kinds: dict) -> dict[DefKey, set[str]]:
    """For each function some path reaches from inside a site: what the sites it runs inside hold open."""
    found: dict[DefKey, set[str]] = {}
    queue = [(t, kind) for edges in graph.callees.values() for t, e in edges if e.site for kind in kinds.get(e.site, ())]
    while queue:
        key, kind = queue.pop()
        held = found.setdefault(key, set())
        if kind not in held:
            held.add(kind)
            queue.extend((t, kind) for t, _ in graph.callees.get(key, ()))
    return found


def _would_nest(graph: CallGraph, kinds: dict, enclosing: dict, key: DefKey, site, first: int, last: int) -> bool:
    """Whether a site of `site`'s role on lines first..last of `key` would run inside a site that holds open
    what it opens, or have one run inside it, on some path of calls."""
    opens = kinds[site.role]
    if opens & enclosing.get(key, set()):
        return True
    inside = [(t, e) for t, e in graph.callees.get(key, ()) if first <= e.line <= last]
    if any(e.site and opens & kinds.get(e.site, frozenset()) for _, e in inside):
        return True
    seen: set[DefKey] = set()
    queue = [t for t, e in inside if not e.site]
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        for target, edge in graph.callees.get(current, ()):
            if edge.site:
                if opens & kinds.get(edge.site, frozenset()):
                    return True
            else:
                queue.append(target)
    return False


def _next_lines(graph: CallGraph, chain: list[DefKey], at: int, trigger) -> set[int]:
    """The lines of `chain[at]` from which the path goes on: its calls of (or references to) the next
    function on the path, or the trigger itself when the path ends there. A nested function on the
    path counts as handed on where its enclosing function calls or passes it."""
    here = chain[at]
    if at == len(chain) - 1:
        return {trigger.line}
    following = set()
    for later in chain[at + 1:]:
        following.add(later)
        if ".<locals>." not in graph.defs[later].qualname:
            break
    return {edge.line for target, edge in graph.callees.get(here, ()) if target in following}


def _bracket(graph: CallGraph, key: DefKey, first: int, last: int, role: str) -> None:
    """Take a placed site into the graph: the calls and triggers of `key` on lines first..last are inside it."""
    def inside(line: int) -> bool:
        return first <= line <= last

    fn = graph.defs[key]
    graph.defs[key] = fn._replace(
        triggers=tuple(t._replace(site=role) if t.site is None and inside(t.line) else t for t in fn.triggers),
    )
    callees = []
    for target, edge in graph.callees.get(key, ()):
        if edge.site is None and inside(edge.line):
            new = edge._replace(site=role)
            graph.callers[target] = [(c, new if (c == key and e is edge) else e) for c, e in graph.callers[target]]
            edge = new
        callees.append((target, edge))
    graph.callees[key] = callees
