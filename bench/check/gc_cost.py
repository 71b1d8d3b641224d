"""A cold `check` (`--no-cache`) with the cyclic garbage collector on and off (the check command turns it off).

Interleaved rounds in the given tree; prints a Markdown table of wall and CPU (user + system) best and median.

    python bench/check/gc_cost.py --tree /path/to/a/copy/of/sglang --rounds 8
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

RUN = "import sys; sys.argv = ['canary-instrument', 'check', '--no-cache', 'srt']; from canary_instrument.cli import main; main()"
VARIANTS = {
    "collector on": "import gc; gc.disable = lambda: None; " + RUN,
    "collector off (as shipped)": RUN,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, help="a folder holding an sglang `srt` package")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    samples = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, code in VARIANTS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], cwd=args.tree, capture_output=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            samples[name].append((wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
    print("| variant | wall best (s) | wall median (s) | CPU best (s) | CPU median (s) |")
    print("|---|---|---|---|---|")
    for name, runs in samples.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"| {name} | {min(walls):.3f} | {statistics.median(walls):.3f} | {min(cpus):.3f} | {statistics.median(cpus):.3f} |")


if __name__ == "__main__":
    main()
