"""CPU of CI301's call-graph rounds alone: the graph of each caller-search round and its wanted list, as `check` builds them.

Runs a cold `check` of a release's `srt` once, serially, from the given source tree of the tool (an editable
install is ignored), keeping the files each round's call graph is built from; then replays those rounds
(the graph, taken in round by round where the tree's `CallGraph` has `add`, else built again each round, and
`callers_wanted` on it) and prints the least and median CPU of the whole sequence. Trees compared this way
share one process's view of the machine, so run them one after the other, several times.

    python bench/check/graph_rounds.py --tree /path/to/tree --sglang 0.5.22 --repeat 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench_check import find_sglang  # this folder's benchmark: where the releases are
from run_tree import use_tree  # this folder's: the tool imported from the given tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, help="a source tree of canary-instrument")
    parser.add_argument("--sglang", default="0.5.22")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    use_tree(args.tree)
    from canary_instrument.catalog import load_catalog
    from canary_instrument.rewrite import scan
    from canary_instrument.rewrite.check import check_tree
    from canary_instrument.rewrite.io import parallel
    from canary_instrument.rewrite.uncovered import callers_wanted

    package = find_sglang(args.sglang)
    if package is None:
        sys.exit(f"sglang {args.sglang}: not found")
    srt = package / "srt"
    catalog = load_catalog(srt)
    graph_class = scan.CallGraph
    rounds: list[list] = []  # the files of the graph each round's wanted list is asked of

    def recording(graph):
        rounds.append(list(graph.files))
        return callers_wanted(graph)

    parallel.MIN_WEIGHT = 1 << 62  # serially: the rounds are what is timed, not the pair
    scan.callers_wanted = recording
    check_tree([srt], catalog)
    scan.callers_wanted = callers_wanted
    samples = []
    for _ in range(args.repeat):
        start = time.process_time()
        graph = None
        for files in rounds:
            if graph is not None and hasattr(graph, "add"):
                graph.add(files[len(graph.files):])
            else:
                graph = graph_class(files)
            callers_wanted(graph)
        samples.append(time.process_time() - start)
    print(f"{Path(args.tree).name}: sglang {args.sglang}, {len(rounds)} rounds "
          f"({', '.join(str(len(files)) for files in rounds)} files): CPU min {min(samples) * 1000:.1f} ms, "
          f"median {statistics.median(samples) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
