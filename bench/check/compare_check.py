"""`check` of two installs of the tool on one tree, interleaved: before and after a change, under the same load.

Each round runs every case once with each install, one after the other, so that the load of a shared
machine falls on both alike. Cases: cold (`--no-cache`), warm (nothing changed since the last run) and
warm with `model_executor/model_runner.py` edited (a file the rules analyse; each round edits it
anew). Each install keeps its own cache folder. Prints a Markdown table: wall best and median, CPU
(user + system) best and median, per case and install.

    python bench/check/compare_check.py --before /path/to/venv-before/bin/canary-instrument \\
        --after /path/to/venv-after/bin/canary-instrument --sglang 0.5.20 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

EDITED = "srt/model_executor/model_runner.py"


def run(argv, cwd) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the canary-instrument script of the install before")
    parser.add_argument("--after", required=True, help="the canary-instrument script of the install after")
    parser.add_argument("--sglang", default="0.5.20", help="a release cached under ~/.cache/canary-instrument/sglang")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    source = Path.home() / ".cache" / "canary-instrument" / "sglang" / args.sglang / "sglang"
    installs = {"before": args.before, "after": args.after}
    cases = ("cold (--no-cache)", "warm (nothing changed)", f"warm, {EDITED} edited")
    samples = {(case, name): [] for case in cases for name in installs}
    with tempfile.TemporaryDirectory(prefix="compare-check-") as work:
        tree = Path(work) / "tree"
        shutil.copytree(source, tree)
        subprocess.run(["git", "init", "-q", str(tree)], check=True)
        hour_ago = time.time() - 3600
        for path in tree.rglob("*"):
            os.utime(path, (hour_ago, hour_ago))  # a checkout nobody is editing this second (rewrite/io/cache.py)
        edited = tree / EDITED
        original = edited.read_bytes()
        caches = {name: ["--cache-dir", str(Path(work) / f"cache-{name}")] for name in installs}
        for name, script in installs.items():
            run([script, "check", *caches[name], "srt"], tree)  # warm-up, fills the cache
        for round_ in range(args.rounds):
            for name, script in installs.items():
                samples[(cases[0], name)].append(run([script, "check", "--no-cache", "srt"], tree))
            for name, script in installs.items():
                samples[(cases[1], name)].append(run([script, "check", *caches[name], "srt"], tree))
            edited.write_bytes(original + f"# edit {round_}\n".encode())
            os.utime(edited, (hour_ago, hour_ago + round_ + 1))
            for name, script in installs.items():
                samples[(cases[2], name)].append(run([script, "check", *caches[name], "srt"], tree))
            edited.write_bytes(original)
            os.utime(edited, (hour_ago, hour_ago))
            for name, script in installs.items():
                run([script, "check", *caches[name], "srt"], tree)  # back to the state the warm case expects
    print(f"sglang {args.sglang} srt, {args.rounds} rounds; load average after: {os.getloadavg()}")
    print()
    print("| case | install | wall best (s) | wall median (s) | CPU best (s) | CPU median (s) |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        for name in installs:
            walls = [w for w, _ in samples[(case, name)]]
            cpus = [c for _, c in samples[(case, name)]]
            print(f"| {case} | {name} | {min(walls):.3f} | {statistics.median(walls):.3f} | "
                  f"{min(cpus):.3f} | {statistics.median(cpus):.3f} |")


if __name__ == "__main__":
    main()
