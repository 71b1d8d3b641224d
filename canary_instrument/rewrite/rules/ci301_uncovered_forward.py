"""CI301 uncovered-forward.

Reports: uncovered forward path: a model forward or a KV-reading graph capture/replay (catalog `triggers`) that
some path of calls reaches outside every catalogued site, e.g. in a new graph-runner class; the message shows
one such path (see [How CI301 follows calls](#how-ci301-follows-calls))

Why: A forward that runs outside every site reads the KV cache unchecked: a new code path the catalog does not
know.

Fix: add a site for it to the catalog
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import UNCOVERED_FORWARD, Finding
from canary_instrument.rewrite.analysis.reach import MODULE

if TYPE_CHECKING:
    from canary_instrument.rewrite.analysis.callgraph import CallGraph, DefKey
    from canary_instrument.rewrite.analysis.reach import TriggerCall

CODE = UNCOVERED_FORWARD
CHAIN = 4  # functions of the path shown in a finding
# A whole-tree rule: rewrite/uncovered.py finds the exposed triggers over the call graph, this
# module says what is reported for each.


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
