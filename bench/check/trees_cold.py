"""Cold `check` (`--no-cache`) of several source trees of the tool on sglang releases, in alternating rounds.

Each round runs every tree once per release, one after the other, so that the load of a shared machine
falls on all alike. Bytecode caches are written (a first untimed run per tree and release). Prints a
Markdown table: wall and CPU (both processes) min and median per release and tree, and which trees print what the reference
tree prints; with `--ast-grep`, each tree's wall over ast-grep's, as the ratio of medians and as the median of the
rounds' ratios (a round's runs follow each other, so a machine whose speed drifts moves both alike). With
`--floor`, each tree also runs with its analysis taken out (`floor_run.py`: start-up, imports, walk, reading,
byte scan and the parse of the files the rules would analyse): what no rule can spare.

    python bench/check/trees_cold.py --tree before=/tmp/eb --tree after=. --sglang 0.5.20 --rounds 7 \
        [--ast-grep] [--one-core] [--floor]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from bench_check import PATTERN, find_sglang, timed_run  # this folder's benchmark: its timing and trees

RUN_TREE = Path(__file__).with_name("run_tree.py")
FLOOR_RUN = Path(__file__).with_name("floor_run.py")


def run(tree: str, srt: Path, one_core: bool = False, floor: bool = False) -> tuple[float, float, str, int]:
    """(wall, CPU of both processes (user + system), stdout, exit code) of one cold check; with ``one_core``
    pinned to one core (`taskset`), where check runs serially: the CPU figure a shared machine disturbs least;
    with ``floor``, the check with its analysis taken out (`floor_run.py`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if one_core else []
    command = [str(FLOOR_RUN), tree, str(srt)] if floor else [str(RUN_TREE), tree, "check", "--no-cache", str(srt)]
    wall, cpu, done = timed_run([*pin, sys.executable, *command], env=env)
    return wall, cpu, done.stdout, done.returncode


def ast_grep(srt: Path) -> tuple[float, float]:
    """(wall, CPU) of ast-grep over the same tree (the reference of issue 22's bar)."""
    tool = shutil.which("ast-grep") or str(Path(sys.executable).with_name("ast-grep"))
    wall, cpu, _ = timed_run([tool, "run", "-p", PATTERN, "-l", "python", str(srt)])
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--sglang", action="append", required=True, metavar="VERSION")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reference", help="the tree whose output (stdout, exit code) the others are compared with")
    parser.add_argument("--ast-grep", action="store_true",
                        help="also run `ast-grep run -p 'contextlib.nullcontext()' -l python SRT` in each round")
    parser.add_argument("--one-core", action="store_true",
                        help="run each check pinned to one core (serially; ast-grep is left as it is)")
    parser.add_argument("--floor", action="store_true",
                        help="also run each tree with its analysis taken out (floor_run.py), as `<name> floor`")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    floors = [f"{name} floor" for name in trees] if args.floor else []
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    samples: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    outputs: dict[tuple[str, str], tuple[str, int]] = {}
    for version in args.sglang:
        package = find_sglang(version)
        if package is None:
            sys.exit(f"sglang {version}: not found")
        srt = package / "srt"
        for name, tree in trees.items():
            _, _, out, code = run(tree, srt, args.one_core)  # untimed: writes the bytecode caches
            outputs[version, name] = (out, code)
        for _ in range(args.rounds):
            for name, tree in trees.items():
                wall, cpu, _, _ = run(tree, srt, args.one_core)
                samples.setdefault((version, name), []).append(wall)
                cpus.setdefault((version, name), []).append(cpu)
                if args.floor:
                    wall, cpu, _, _ = run(tree, srt, args.one_core, floor=True)
                    samples.setdefault((version, f"{name} floor"), []).append(wall)
                    cpus.setdefault((version, f"{name} floor"), []).append(cpu)
            if args.ast_grep:
                wall, cpu = ast_grep(srt)
                samples.setdefault((version, "ast-grep"), []).append(wall)
                cpus.setdefault((version, "ast-grep"), []).append(cpu)
    pinned = ", each check on one core" if args.one_core else ""
    print(f"rounds: {args.rounds}, bytecode caching on{pinned}; seconds, min / median; load average before: {load}\n")
    reference = args.reference or next(iter(trees))
    shown = [*trees, *floors, "ast-grep"] if args.ast_grep else [*trees, *floors]
    print("| release | " + " | ".join(f"{n} wall | {n} CPU" for n in shown) + f" | output as {reference}'s |")
    print("|---" * (2 * len(shown) + 2) + "|")
    for version in args.sglang:
        cells = [f"{min(table[version, n]):.3f} / {statistics.median(table[version, n]):.3f}"
                 for n in shown for table in (samples, cpus)]
        same = [n for n in trees if n != reference and outputs[version, n] == outputs[version, reference]]
        print(f"| {version} | " + " | ".join(cells) + f" | {', '.join(same) or 'none'} |")
    if args.ast_grep:
        print("\nmedian wall / ast-grep's median wall, and the median of each round's wall / that round's "
              "ast-grep wall (issue 22's bar: at most 0.25):\n")
        for version in args.sglang:
            bar = statistics.median(samples[version, "ast-grep"])
            paired = {n: statistics.median(w / a for w, a in zip(samples[version, n], samples[version, "ast-grep"]))
                      for n in [*trees, *floors]}
            print(f"- {version}: " + ", ".join(
                f"{n} {statistics.median(samples[version, n]) / bar:.2f} (per round {paired[n]:.2f})"
                for n in [*trees, *floors]))


if __name__ == "__main__":
    main()
