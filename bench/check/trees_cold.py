"""Cold `check` (`--no-cache`) of several source trees of the tool on sglang releases, in alternating rounds.

Each round runs every tree once per release, one after the other, so that the load of a shared machine
falls on all alike. Bytecode caches are written (a first untimed run per tree and release). Prints a
Markdown table: wall and CPU (both processes) min and median per release and tree, and which trees print what the reference
tree prints.

    python bench/check/trees_cold.py --tree before=/tmp/eb --tree after=. --sglang 0.5.20 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUN_TREE = Path(__file__).with_name("run_tree.py")


def run(tree: str, srt: Path) -> tuple[float, float, bytes, int]:
    """(wall, CPU of both processes (user + system), stdout, exit code) of one cold check."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(RUN_TREE), tree, "check", "--no-cache", str(srt)],
                          capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.stdout, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--sglang", action="append", required=True, metavar="VERSION")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reference", help="the tree whose output (stdout, exit code) the others are compared with")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    cache = Path.home() / ".cache" / "canary-instrument" / "sglang"
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    samples: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], tuple[bytes, int]] = {}
    for version in args.sglang:
        srt = cache / version / "sglang" / "srt"
        for name, tree in trees.items():
            _, _, out, code = run(tree, srt)  # untimed: writes the bytecode caches
            outputs[version, name] = (out, code)
        for _ in range(args.rounds):
            for name, tree in trees.items():
                wall, cpu, _, _ = run(tree, srt)
                samples.setdefault((version, name), []).append(wall)
                cpus.setdefault((version, name), []).append(cpu)
    print(f"rounds: {args.rounds}, bytecode caching on; seconds, min / median; load average before: {load}\n")
    reference = args.reference or next(iter(trees))
    print("| release | " + " | ".join(f"{n} wall | {n} CPU" for n in trees) + f" | output as {reference}'s |")
    print("|---" * (2 * len(trees) + 2) + "|")
    for version in args.sglang:
        cells = [f"{min(table[version, n]):.3f} / {statistics.median(table[version, n]):.3f}"
                 for n in trees for table in (samples, cpus)]
        same = [n for n in trees if n != reference and outputs[version, n] == outputs[version, reference]]
        print(f"| {version} | " + " | ".join(cells) + f" | {', '.join(same) or 'none'} |")


if __name__ == "__main__":
    main()
