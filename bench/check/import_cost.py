"""CPU cost of the libraries considered for check's plumbing, on top of the imports `check` makes anyway.

Each figure is the CPU time (user + system of this interpreter) of one snippet run after importing the
check command's own modules (platformdirs, which they import, is imported afresh), the least and the median of `--repeat` fresh interpreters. The warm
`check` pays a library's import on every run when it imports it on every run; the cold one pays the
process pool's before its worker starts.

    python bench/check/import_cost.py --repeat 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

SNIPPETS = {
    "platformdirs (+ user_cache_path)": "import platformdirs; platformdirs.user_cache_path('x', appauthor=False)",
    "pathspec (typing_extensions installed)": "import pathspec",
    "pathspec (typing_extensions hidden)": "import sys; sys.modules['typing_extensions'] = None; import pathspec",
    "msgspec": "import msgspec",
    "pydantic (+ one model)": "import pydantic\nclass A(pydantic.BaseModel):\n    x: int\nA(x=1)",
    "multiprocessing + concurrent.futures.ProcessPoolExecutor": (
        "import multiprocessing; from concurrent.futures import ProcessPoolExecutor"
    ),
    "multiprocessing + its Value (ctypes)": "import multiprocessing; multiprocessing.get_context('fork').Value('q', 0)",
}

TEMPLATE = """
import time
import sys
import canary_instrument.cli, canary_instrument.rewrite.check, canary_instrument.rewrite.io.cache
for name in [m for m in sys.modules if m.split(".")[0] == "platformdirs"]:
    del sys.modules[name]  # check imports it now: time it as if it did not
start = time.process_time()
try:
    exec(compile({code!r}, "snippet", "exec"))
except ImportError:
    print("missing")
else:
    print(time.process_time() - start)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print("| library | CPU min (ms) | CPU median (ms) |")
    print("|---|---|---|")
    for name, code in SNIPPETS.items():
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, "-c", TEMPLATE.format(code=code)], capture_output=True,
                                 text=True, check=True).stdout.split()[-1]
            if out == "missing":
                break
            runs.append(float(out) * 1000)
        if runs:
            print(f"| {name} | {min(runs):.1f} | {statistics.median(runs):.1f} |")
        else:
            print(f"| {name} | not installed | |")


if __name__ == "__main__":
    main()
