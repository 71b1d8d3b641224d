"""Which calls of the call graph are resolved: those of the functions from which a path of calls reaches
a trigger or a KV-reading forward.

`uncovered` asks the call graph only about such functions (whether a path reaches one outside every
site, who calls one, whether one is exposed); a function that reaches none can call one of them only
by spelling its name, so they are found backwards from the triggers, by name, and no other call of
the tree is resolved. Every caller of such a function is one too, and none of the others is on a
path to one: leaving their calls unresolved changes neither which of them is exposed nor the first
path found to it (`uncovered.exposed` meets them in the same order).
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING

from canary_instrument.rewrite.analysis.reach_records import METHOD_AT, Edge, ReachFacts

if TYPE_CHECKING:
    from canary_instrument.rewrite.analysis.callgraph import CallGraph, DefKey


class CallIndex:
    """The calls of every function by each name they spell: kept as files join the graph, since listing
    them meets every call of the tree. A call spells the method it names (`METHOD_AT`, inlined from
    `reach_records.target_method`), the last part of a nested function's name, and every part of a
    qualified name (`mod.f.cache_clear` resolves to `f`, `mod.Cls(...)` to its `__init__`): one of them
    names each function it resolves to (`_names`)."""

    def __init__(self) -> None:
        self.spelling: dict[str, list[tuple[DefKey, Edge]]] = defaultdict(list)

    def add(self, index: int, facts: ReachFacts) -> None:
        spelling, name_at = self.spelling, METHOD_AT
        for fn in facts.defs:
            key = (index, fn.qualname)
            for edge in fn.edges:
                target = edge.target
                position = name_at.get(target[0])
                if position is not None:
                    spelling[target[position]].append((key, edge))
                elif target[0] == "global":
                    for name in target[1].split("."):
                        spelling[name].append((key, edge))
                elif target[0] == "def":
                    spelling[target[1].rpartition(".")[2]].append((key, edge))


def link(graph: CallGraph) -> tuple[dict, dict, set]:
    """(callees, callers, weak) of every function from which a path reaches a trigger or a KV-reading
    forward, in the order of the functions and their calls (as if every call were resolved): a path
    shown in a finding is the first one found in that order. `weak`: the (caller, callee) pairs where
    the callee is only a subclass's override of the method the receiver's class has (real calls, but
    a path shown in a finding goes another way if it can)."""
    callees: dict[DefKey, list[tuple[DefKey, Edge]]] = {}
    callers: dict[DefKey, list[tuple[DefKey, Edge]]] = defaultdict(list)
    weak_calls: set[tuple[DefKey, DefKey]] = set()
    spelling = graph.calls.spelling
    reaching = {key for key, fn in graph.defs.items() if fn.triggers or fn.kv}
    queue = deque(reaching)
    while queue:
        key = queue.popleft()
        for name in _names(graph, key):
            for caller, edge in spelling.get(name, ()):
                if caller not in reaching and key in graph.resolve(caller, edge.target, edge.call):
                    reaching.add(caller)
                    queue.append(caller)
    for key, fn in graph.defs.items():
        if key not in reaching:
            continue
        out = []
        for edge in fn.edges:
            targets = graph.resolve(key, edge.target, edge.call)
            weak = getattr(targets, "overrides", None)
            for target in targets:
                if target != key:
                    out.append((target, edge))
                    callers[target].append((key, edge))
                    if weak and target in weak:
                        weak_calls.add((key, target))
        callees[key] = out
    return callees, callers, weak_calls


def _names(graph: CallGraph, key: DefKey) -> set[str]:
    """The names a call of function `key` can spell: its own, and for a constructor the name of its
    class or of any subclass that inherits it."""
    fn = graph.defs[key]
    name = fn.qualname.rpartition(".")[2]
    names = {name}
    if fn.cls is not None and name == "__init__":
        cls = (key[0], fn.cls)
        names.update(c[1].rpartition(".")[2] for c in (cls, *graph.descendants(cls)))
    return names
