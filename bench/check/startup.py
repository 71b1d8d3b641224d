"""What a cold `check` pays before it reads a file: interpreter start-up, the imports, the catalog.

Each step runs in fresh interpreters (this one's executable: run it with a plain virtualenv's Python, as
a pre-commit hook runs), one after the other in each round, and is timed inside the interpreter from the
step's first statement (the start-up line: the whole process, measured outside). The steps add up as a
`check` meets them: click and the command line, then the rewriter's modules with the cyclic collector off
(as `cli.check` imports them; the line after, with it on), then the catalog loaded and its byte-scan
regexes compiled. The last line says how much of the rewriter's import is spent making its dataclasses
(`dataclasses._process_class`).

    <venv>/bin/python bench/check/startup.py --tree . --repeat 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS = {
    "start-up (`python -c pass`, whole process)": None,
    "click and the command line (`canary_instrument.cli`)": ("", "import canary_instrument.cli"),
    "the rewriter's modules, collector off": (
        "import canary_instrument.cli, gc; gc.disable()",
        "import canary_instrument.rewrite.check, canary_instrument.rewrite.io.cache",
    ),
    "the same with the collector on": (
        "import canary_instrument.cli",
        "import canary_instrument.rewrite.check, canary_instrument.rewrite.io.cache",
    ),
    "the catalog loaded, the prefilter built": (
        "import canary_instrument.cli, gc; gc.disable(); import canary_instrument.rewrite.check",
        "from canary_instrument.catalog import load_catalog\n"
        "from canary_instrument.rewrite.io.prefilter import Prefilter\nPrefilter(load_catalog())",
    ),
    "of the rewriter's modules: making dataclasses": (
        "import canary_instrument.cli, gc, dataclasses; gc.disable()\n"
        "spent = [0.0]\nmake = dataclasses._process_class\n"
        "def timed(*a, **k):\n    t = time.perf_counter()\n    try:\n        return make(*a, **k)\n"
        "    finally:\n        spent[0] += time.perf_counter() - t\n"
        "dataclasses._process_class = timed",
        "import canary_instrument.rewrite.check, canary_instrument.rewrite.io.cache\nelapsed = spent[0]",
    ),
}

TEMPLATE = """
import sys, time
sys.path.insert(0, {here!r})
from run_tree import use_tree
use_tree({tree!r})
{setup}
t = time.perf_counter()
elapsed = None
{step}
print(elapsed if elapsed is not None else time.perf_counter() - t)
"""


def once(tree: str, step) -> float:
    if step is None:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        return time.perf_counter() - start
    setup, body = step
    code = TEMPLATE.format(here=str(Path(__file__).parent), tree=tree, setup=setup, step=body)
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="the source tree of the tool to import")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in STEPS}
    for name, step in STEPS.items():
        once(args.tree, step)  # bytecode caches written, untimed
    for _ in range(args.repeat):
        for name, step in STEPS.items():
            samples[name].append(once(args.tree, step))
    print(f"{args.repeat} rounds, ms, min / median\n")
    print("| step | ms |\n|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {min(values) * 1e3:.1f} / {statistics.median(values) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
