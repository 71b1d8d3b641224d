"""How much of `check`'s parse and analysis parsing only part of each file could spare, at best.

Issue 22 suggests parsing only what the roles need. CI301's call graph reads every function of an
analysed file (receiver types from any method's attribute assignments and parameters, every function a
possible caller), so a method body can be left out only where nothing in it can change the graph. This
benchmark takes the most favourable view: it runs a cold `check` serially, takes from its final call
graph the names of every function from which a path reaches a trigger or a KV-reading forward (which an
implementation could not know before parsing), and replaces by `...` the body of every method of a
top-level class whose text spells none of those names, no `self.<attribute> =` assignment, no import,
and none of the catalog's trigger, model-runner or canary words. It then times parse, site analysis and
reach facts of each analysed file whole and so cut (least of `--repeat` runs, this process's CPU) and
prints the files that cost most and the totals. Last, the share of those files' syntax nodes that lie in
functions the final graph resolves calls of (those from which a path reaches a trigger or a KV-reading
forward, and those with a call spelling one of their names): what a reach walk that worked out a call's
target only where the graph asks could leave out, at most.

    python bench/check/partial_parse.py --sglang 0.5.22 --repeat 5
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import time
from collections import deque
from pathlib import Path

from bench_check import find_sglang  # this folder's benchmark: where the releases are

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite import scan
from canary_instrument.rewrite.analysis.locate import analyse
from canary_instrument.rewrite.analysis.reach import MODULE, reach_facts, site_spans
from canary_instrument.rewrite.analysis.tree import parse_source, split_lines
from canary_instrument.rewrite.check import check_tree
from canary_instrument.rewrite.io import parallel
from canary_instrument.rewrite.io.files import decode_source


def reaching_names(graph) -> set[str]:
    """The last part of the name of every function from which a path of calls reaches a trigger or a
    KV-reading forward (the graph's `callers` hold every call into such a function)."""
    found = {key for key, fn in graph.defs.items() if fn.triggers or fn.kv}
    queue = deque(found)
    while queue:
        for caller, _ in graph.callers.get(queue.popleft(), ()):
            if caller not in found:
                found.add(caller)
                queue.append(caller)
    return {qualname.rpartition(".")[2] for _, qualname in found}


def catalog_words(catalog) -> set[str]:
    words = {"canary", *catalog.placeholder_names}
    patterns = [p for trigger in catalog.triggers for p in trigger.calls] + list(catalog.model_runner.names)
    for pattern in patterns:
        words.update(w for w in re.split(r"[*?.\[\]]", pattern) if len(w) > 2)
    return words


def cut(text: str, keep: re.Pattern) -> str:
    """`text` with the body of each method of a top-level class that `keep` finds nothing in replaced by `...`."""
    lines = text.splitlines(keepends=True)
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for method in node.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first, last = method.body[0].lineno, method.end_lineno
            if lines[first - 1][: method.body[0].col_offset].strip():
                continue  # a body on the line of the signature's end
            if keep.search("".join(lines[first - 1 : last])):
                continue
            indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
            lines[first - 1] = indent + "...\n"
            for index in range(first, last):
                lines[index] = "\n"
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", default="0.5.22")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    package = find_sglang(args.sglang)
    if package is None:
        sys.exit(f"sglang {args.sglang}: not found")
    srt = package / "srt"
    catalog = load_catalog(srt)
    parallel.MIN_WEIGHT = 1 << 62  # serially, so that the graph built last is this process's
    graphs = []
    graph_class = scan.CallGraph

    class Kept(graph_class):
        def __init__(self, files):
            super().__init__(files)
            graphs.append(self)

    scan.CallGraph = Kept
    check_tree([srt], catalog)
    scan.CallGraph = graph_class
    graph = graphs[-1]
    words = reaching_names(graph) | catalog_words(catalog)
    keep = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(words))) + r")\b|self\.\w+\s*(?::[^=\n]*)?=(?!=)|\bimport\b")

    def cost(path: Path, text: str) -> float:
        best = float("inf")
        for _ in range(args.repeat):
            start = time.process_time()
            source = decode_source(path, text.encode())
            tree = parse_source(source)
            lines = split_lines(source.text)
            found = analyse(path, tree, catalog, lines)
            reach_facts(path, tree, lines, site_spans(found), catalog)
            best = min(best, time.process_time() - start)
        return best

    rows = []
    for path, _ in graph.files:
        text = Path(path).read_text(encoding="utf-8")
        shorter = cut(text, keep)
        rows.append((cost(path, text), cost(path, shorter), len(text), len(shorter.replace("\n", "")), path))
    rows.sort(key=lambda row: -row[0])
    print(f"sglang {args.sglang}: {len(graph.files)} files in the call graph, {len(words)} words kept\n")
    print("| file | bytes | bytes left | whole (ms) | cut (ms) |")
    print("|---|---|---|---|---|")
    for whole, part, size, left, path in rows[:8]:
        print(f"| {Path(path).relative_to(srt)} | {size:,} | {left:,} | {whole * 1000:.1f} | {part * 1000:.1f} |")
    whole, part = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"| all {len(rows)} | {sum(r[2] for r in rows):,} | {sum(r[3] for r in rows):,} | {whole * 1000:.1f} "
          f"| {part * 1000:.1f} ({(1 - part / whole) * 100:.0f} % less) |")
    reaching = set(graph.callees)
    named = {fn.qualname.rpartition(".")[2] for key, fn in graph.defs.items() if key in reaching}
    asked = reaching | {caller for name in named for caller, _ in graph.calls.spelling.get(name, ())}
    counts = [0, 0, 0]  # all nodes, in reaching functions, in those or their callers by name
    for index, (path, _) in enumerate(graph.files):
        for qualname, nodes in function_nodes(ast.parse(Path(path).read_text(encoding="utf-8"))):
            counts[0] += nodes
            counts[1] += nodes if (index, qualname) in reaching else 0
            counts[2] += nodes if (index, qualname) in asked else 0
    print(f"\nsyntax nodes in functions the graph resolves calls of: {counts[1] / counts[0]:.1%} "
          f"({len(reaching)} of {len(graph.defs)} functions); with those whose calls it resolves by name: "
          f"{counts[2] / counts[0]:.1%} of {counts[0]:,}")


def function_nodes(tree: ast.Module):
    """(qualname as `reach` names it, syntax nodes of its own body) for the module's code and every
    function, each node counted in the innermost function holding it."""
    out = []

    def visit(node, qualname: str, cls: str | None) -> None:
        own = 0
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = f"{cls}.{child.name}" if cls else (
                    child.name if qualname == MODULE else f"{qualname}.<locals>.{child.name}")
                visit(child, inner, None)
            elif isinstance(child, ast.ClassDef):
                visit(child, qualname, f"{cls}.{child.name}" if cls else child.name)
            else:
                own += sum(1 for _ in ast.walk(child))
        out.append((qualname, own))

    visit(tree, MODULE, None)
    return out


if __name__ == "__main__":
    main()
