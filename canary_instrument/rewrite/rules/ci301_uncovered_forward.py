"""CI301 uncovered-forward.

Reports: uncovered forward path: a model forward or a KV-reading graph capture/replay (catalog `triggers`) that
some path of calls reaches outside every catalogued site, e.g. in a new graph-runner class; the message shows
one such path (see [How CI301 follows calls](#how-ci301-follows-calls))

Why: A forward that runs outside every site reads the KV cache unchecked: a new code path the catalog does not
know.

Fix: `canary-instrument scaffold` (it places a site where a catalog role's shape fits the path); where none does,
add a role to the catalog; a reviewed finding: `# noqa: CI301`
"""

from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.callgraph import CallGraph, DefKey
from canary_instrument.rewrite.analysis.reach import MODULE, ReachFacts, TriggerCall
from canary_instrument.rewrite.analysis.reach_records import target_method
from canary_instrument.rewrite.findings import UNCOVERED_FORWARD, Finding
from canary_instrument.rewrite.syntax.naming import receiver_fits

CODE = UNCOVERED_FORWARD
CHAIN = 4  # functions of the path shown in a finding

# A whole-tree rule: check's tree pass runs `uncovered_findings` over the call graph of the analysed files,
# and its caller search asks `callers_wanted` which other files may call into a forward path.
#
# A call is inside a site when it sits in a located site's statements or in a `with` on a canary-named
# variable (a bracket the catalog does not locate is CI103's to report, not CI301's).
# A function is *exposed* when a path of calls reaches it without passing through a site:
# from module-level code, or from a function nothing in the tree calls (an entry point), along calls
# that are not inside a site. A forward trigger in an exposed function, outside a site, is reported;
# a graph capture or replay only when what it captures or replays reaches a KV-reading forward.

# How far above a trigger the caller search looks for callers of an entry point (a function no
# analysed file calls); one further up is taken as a real entry point. It must exceed how far above
# its trigger a site sits (forward -> _forward_raw -> runner.execute -> the runner's model forward).
ROOT_SEARCH = 4


def uncovered_findings(files: list[tuple[Path, ReachFacts]], catalog: Catalog, graph: CallGraph | None = None) -> list[Finding]:
    """CI301's findings over the files' facts (`graph`: their call graph, when already built)."""
    if not catalog.triggers or not any(t for _, facts in files for fn in facts.defs for t in fn.triggers):
        return []
    graph = graph or CallGraph(files)
    via = exposed(graph)
    return [finding(graph, key, trigger, via) for key, trigger in _exposed_triggers(graph, via)]


def uncovered_paths(graph: CallGraph) -> list[tuple[DefKey, TriggerCall, list[DefKey]]]:
    """Each exposed trigger as (its function, the trigger, the path root..function that reaches it): what
    scaffold places a covering site on (transforms/cover.py)."""
    via = exposed(graph)
    out = []
    for key, trigger in _exposed_triggers(graph, via):
        chain = [key]
        while via[chain[-1]] is not None and via[chain[-1]] not in chain:
            chain.append(via[chain[-1]])
        out.append((key, trigger, chain[::-1]))
    return out


def _exposed_triggers(graph: CallGraph, via: dict):
    kv = kv_reaching(graph)
    for key, fn in graph.defs.items():
        for trigger in fn.triggers:
            if trigger.site is not None or key not in via:
                continue
            if trigger.kind == "graph" and not graph_reads_kv(graph, key, trigger, kv):
                continue
            yield key, trigger


def callers_wanted(graph: CallGraph) -> set[tuple]:
    """What a caller search of the other files must look for, so that the verdicts can change only by
    what the tree really holds: the callers of every function on an uncovered path to a trigger
    (a path of calls outside sites) that is not exposed yet (a new caller may expose it), and of
    every entry point on such a path up to ROOT_SEARCH calls above the trigger (a caller may show
    that it is no entry point). Exposed functions with a caller need no search: more callers
    cannot cover them.

    ("call", name, class) for a method (a receiver that fits the class), ("call", name, None) for a
    plain function or, named by its class, a constructor, ("subclass", class) for the classes
    whose subclasses inherit calls on `self`, and ("define", class) for a class that types a
    receiver on such a path but whose file was not analysed (so the call resolves by its class,
    not by naming), with ("imported", class, module) for where the code imports it from (a file
    that holds its definition there spares the search of the tree for it)."""
    kv = kv_reaching(graph)
    depth: dict[DefKey, int] = {}
    queue: deque[DefKey] = deque()
    for key, fn in graph.defs.items():
        if any(t.site is None and (t.kind != "graph" or graph_reads_kv(graph, key, t, kv)) for t in fn.triggers):
            depth[key] = 0
            queue.append(key)
    while queue:
        key = queue.popleft()
        for caller, edge in graph.callers.get(key, ()):
            if edge.site is None and caller not in depth:
                depth[caller] = depth[key] + 1
                queue.append(caller)
    via = exposed(graph)
    wanted: set[tuple] = set()
    graph.missing = set()
    graph.missing_from = set()
    for key in depth:
        for edge in graph.defs[key].edges:
            graph.resolve(key, edge.target, edge.call)
    # A call of a method of that name elsewhere may reach it once the classes typing its receiver are
    # known (a base's property, a field's class): their definitions are searched for where the
    # receiver's name fits the method's class (the name only picks what is worth a search).
    # A receiver typed only by a class of the tree not analysed, a base of such a method's class, may
    # run that method's override: that class is wanted too (`CallGraph.instances`).
    owners: dict[str, set[str]] = defaultdict(set)
    graph.unanalysed_bases = defaultdict(set)
    for key in depth:
        fn = graph.defs[key]
        if fn.cls is not None:
            name = fn.qualname.rpartition(".")[2]
            owners[name].add(fn.cls.rpartition(".")[2])
            cls = graph.self_class(key)
            if cls is not None:
                graph.unanalysed_bases[name].update(graph.unanalysed_base_names(cls))
    graph.bases_wanted = True
    for name, classes in owners.items():
        for key, edge in graph.calls.spelling.get(name, ()):
            if target_method(edge.target) == name and any(
                receiver_fits(_receiver_word(edge.target), c) for c in classes
            ):
                graph.resolve(key, edge.target, edge.call)
    graph.bases_wanted = False
    wanted.update(("define", name) for name in graph.missing)
    wanted.update(("imported", name, module) for name, module in graph.missing_from)
    graph.missing = None
    for key, hops in depth.items():
        fn = graph.defs[key]
        if fn.qualname == MODULE or ".<locals>." in fn.qualname:
            continue  # module code runs on import; a nested function is called where it is defined
        root = key in via and via[key] is None
        if key in via and (not root or hops > ROOT_SEARCH):
            continue
        if fn.cls is None:
            wanted.add(("call", fn.qualname, None))
            continue
        cls = fn.cls.rpartition(".")[2]
        name = fn.qualname.rpartition(".")[2]
        wanted.add(("subclass", cls))
        if name == "__init__":
            wanted.add(("call", cls, None))
        elif root or not name.startswith("_"):
            # A private method is called on `self` (its class's file, or a subclass's, found by the
            # subclass search); its calls on other objects are looked for only where it would
            # otherwise count as an entry point (each name searched costs a pass over the tree).
            wanted.add(("call", name, cls))
    return wanted


def _receiver_word(target: tuple) -> str | None:
    kind = target[0]
    if kind in ("attr", "var"):
        return target[1]
    if kind == "ret":
        return target[3]
    if kind == "name":
        return target[2]
    return None


def exposed(graph: CallGraph) -> dict[DefKey, DefKey | None]:
    """Exposed functions, each mapped to the exposed caller it is first reached from (None: a root)."""
    via: dict[DefKey, DefKey | None] = {}
    weak: dict[DefKey, int] = {}  # how many subclass-override hops the path to each takes (fewest first)
    queue: deque[DefKey] = deque()
    for key, fn in graph.defs.items():
        if fn.qualname == MODULE or not any(caller != key for caller, _ in graph.callers.get(key, ())):
            via[key] = None
            weak[key] = 0
            queue.append(key)
    done: set[DefKey] = set()
    while queue:
        key = queue.popleft()
        if key in done:
            continue
        done.add(key)
        for target, edge in graph.callees.get(key, ()):
            if edge.site is not None or target in done:
                continue
            hops = weak[key] + ((key, target) in graph.weak)
            if target not in via or hops < weak[target]:
                via[target] = key
                weak[target] = hops
                # A path through the receiver's own class goes first (a 0-1 breadth-first search).
                queue.append(target) if hops > weak[key] else queue.appendleft(target)
    return via


def kv_reaching(graph: CallGraph) -> set[DefKey]:
    """Functions from which some path of calls (inside sites or not) reaches a KV-reading forward."""
    found = {key for key, fn in graph.defs.items() if fn.kv}
    queue = deque(found)
    while queue:
        key = queue.popleft()
        for caller, _ in graph.callers.get(key, ()):
            if caller not in found:
                found.add(caller)
                queue.append(caller)
    return found


def graph_reads_kv(graph: CallGraph, key: DefKey, trigger: TriggerCall, kv: set[DefKey]) -> bool:
    """Whether a graph capture or replay can run a KV-reading forward: what it calls or is given
    reaches one, or the class that owns what it calls (the graph runner) has a method that does.
    Conservatively true when the call cannot be resolved."""
    targets = []
    for target in (trigger.target, *trigger.passed):
        if target is not None:
            targets.extend(graph.resolve(key, target, call=True))
    if not targets:
        return True
    if any(t in kv for t in targets):
        return True
    owners = {graph.self_class(t) for t in targets} - {None}
    return any(
        method in kv
        for owner in owners
        for method in graph.methods.get(owner, {}).values()
    ) or any(
        (index, qualname) in kv
        for (index, cls) in owners
        for (i, qualname) in graph.defs
        if i == index and qualname.startswith(cls + ".")
    )


def finding(graph: CallGraph, key: DefKey, trigger: TriggerCall, via: dict) -> Finding:
    """The finding of a trigger in the exposed function `key`, with the path `via` reaches it by."""
    chain = []
    current = key
    while current is not None and len(chain) < CHAIN:
        chain.append(current)
        current = via[current]
    chain.reverse()
    names = " -> ".join(describe(graph, k) for k in chain)
    root = chain[0]
    if current is not None:
        how = f"reached via ... -> {names}"
    elif graph.defs[root].qualname == MODULE:
        module = graph.files[root[0]][1].module.rpartition(".")[2]
        how = f"reached from module-level code of {module}: {names.replace(MODULE + ' -> ', '')}"
    elif root == key:
        how = f"nothing found in the tree calls {describe(graph, key)}"
    else:
        how = f"reached from {describe(graph, root)}, which nothing found in the tree calls: {names}"
    return Finding(
        graph.files[key[0]][0], trigger.line, trigger.col, CODE,
        f"uncovered forward path: {trigger.what} `{trigger.name}(...)` in {describe(graph, key)} runs outside "
        f"every catalogued site ({how}); add a site for it to the catalog",
    )


def describe(graph: CallGraph, key: DefKey) -> str:
    """How a finding names a function of the call graph: `Class.method`, `module.function`, `Class.method.inner`
    for a nested function."""
    fn = graph.defs[key]
    name = fn.qualname.replace(".<locals>.", ".")
    outer = fn.qualname.split(".<locals>.")[0]
    if fn.qualname != MODULE and "." not in outer:  # a module-level function (or one nested in it)
        module = graph.files[key[0]][1].module.rpartition(".")[2]
        name = f"{module}.{name}" if module else name
    return name
