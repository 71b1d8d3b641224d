"""The calls of the call graph's functions by each name they spell (`CallIndex`): how `CallGraph` finds,
backwards from the triggers, the functions from which a path of calls reaches one (`CallGraph._link`).
"""

from __future__ import annotations

from collections import defaultdict

from canary_instrument.rewrite.analysis.reach_records import METHOD_AT, Edge, ReachFacts

DefKey = tuple[int, str]  # (file index, function qualname)


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
