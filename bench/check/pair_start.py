"""When each side of check's first map takes its first file: the second core's start-up cost, per source tree.

Runs a cold `check` of a source tree of the tool (`run_tree.py`'s way: an editable install is ignored)
in a fresh interpreter per round, trees alternating, and prints per tree the least and median delay
from the start of the first map to the first file each side examines, and the wall of that map.

    python bench/check/pair_start.py --tree pool=/tmp/main --tree fork=. --sglang 0.5.20 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import contextlib, io, json, os, sys, tempfile, time
tree, srt, log, here = sys.argv[1:5]
sys.path.insert(0, here)
from run_tree import use_tree
use_tree(tree)
import canary_instrument.rewrite.io.parallel as parallel
import canary_instrument.rewrite.scan as scan
examine, start_map = scan.Scan.examine, parallel.Pair.map
marks = {}
def probe(self, key, st):
    with open(log, "a") as out:
        out.write(json.dumps([os.getpid(), time.perf_counter()]) + "\n")
    scan.Scan.examine = examine  # one mark per side: the rest runs unprobed (the child inherits this copy)
    return examine(self, key, st)
def timed_map(self, name, items, weights):
    if "map" in marks:
        return start_map(self, name, items, weights)
    marks["map"] = time.perf_counter()
    try:
        return start_map(self, name, items, weights)
    finally:
        marks["end"] = time.perf_counter()
scan.Scan.examine = probe
parallel.Pair.map = timed_map
from canary_instrument.cli import main
sys.argv = ["canary-instrument", "check", "--no-cache", srt]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
with open(log, "a") as out:
    out.write(json.dumps(["map", marks["map"], marks["end"], os.getpid()]) + "\n")
"""


def one(tree: str, srt: Path, log: Path) -> tuple[float, float, float]:
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", PROBE, tree, str(srt), str(log), str(Path(__file__).parent)], check=True,
                   env=env)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    _, start, end, parent = next(r for r in rows if r[0] == "map")
    firsts = {}
    for pid, at in (r for r in rows if r[0] != "map"):
        firsts.setdefault(pid, at)
    child = min((at for pid, at in firsts.items() if pid != parent), default=float("nan"))
    return firsts[parent] - start, child - start, end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--sglang", default="0.5.20")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    srt = Path.home() / ".cache" / "canary-instrument" / "sglang" / args.sglang / "sglang" / "srt"
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"pair-start-{os.getpid()}.jsonl"
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
    for name, tree in trees.items():
        one(tree, srt, log)  # untimed: writes the bytecode caches
    for _ in range(args.rounds):
        for name, tree in trees.items():
            samples[name].append(one(tree, srt, log))
    log.unlink(missing_ok=True)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"sglang {args.sglang}, {args.rounds} rounds, bytecode caching on; ms, min / median; load average after: {load}\n")
    print("| tree | this process's first file | the second process's first file | first map (wall) |")
    print("|---|---|---|---|")
    for name, rows in samples.items():
        cells = []
        for column in range(3):
            values = [row[column] * 1000 for row in rows]
            cells.append(f"{min(values):.0f} / {statistics.median(values):.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
