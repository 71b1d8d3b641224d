"""Where one cold `check` spends its wall time, phase by phase, in both of its processes.

Runs `check --no-cache SRT` from a source tree (as `run_tree.py` does) with timers around its phases:
the imports, the walk, the shared pass (`Scan.files`; within it the parse, site and hook analysis and
reach walk), and CI301's caller-search rounds (`Scan.expand`; within them each round's call graph and
wanted list, which this process computes alone, the byte search and the analysis of the files found or
given). Each process writes its spans when it ends; the report gives each phase's span in this process
and, per process, the time its timed parts took. Timers cost a little; use it for shares, not the bar.

    <venv>/bin/python bench/check/timeline.py TREE SRT
"""

import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

from run_tree import use_tree  # this folder's: the tool imported from the given tree

tree, srt = sys.argv[1:]
use_tree(tree)
START = time.perf_counter()
SPANS: list[tuple[int, str, float, float]] = []
from canary_instrument import cli  # noqa: E402
from canary_instrument.rewrite import check, scan  # noqa: E402
from canary_instrument.rewrite.analysis import callgraph  # noqa: E402
from canary_instrument.rewrite.io import callers  # noqa: E402

SPANS.append((os.getpid(), "imports", 0.0, time.perf_counter() - START))
TIMED = [
    (check, "python_files", "walk"), (scan.Scan, "files", "shared pass"), (scan, "parse_source", "parse"),
    (scan, "analyse", "site and hook analysis"), (scan, "reach_facts", "reach walk"),
    (scan.Scan, "expand", "caller-search rounds"), (scan, "CallGraph", "call graph"),
    (callgraph.CallGraph, "add", "call graph"), (scan, "callers_wanted", "wanted list"),
    (callers.CallerSearch, "find", "byte search"), (scan.Scan, "_reports_of", "found files analysed"),
    (check, "_join", "tree pass"),
]


def timed(owner, name: str, label: str) -> None:
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPANS.append((os.getpid(), label, began - START, time.perf_counter() - START))

    setattr(owner, name, wrapper)


for owner, name, label in TIMED:
    timed(owner, name, label)
OUT = tempfile.mkdtemp(prefix="check-timeline-")
PARENT = os.getpid()
_exit = os._exit


def write_and_exit(code: int) -> None:
    """Both processes end with `os._exit` (the child always, this one after `check`): write the spans first."""
    with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as out:
        json.dump([span for span in SPANS if span[0] == os.getpid()], out)
    if os.getpid() != PARENT:
        _exit(code)
    report(code)


def report(code: int) -> None:
    spans = []
    for name in os.listdir(OUT):
        with open(os.path.join(OUT, name)) as source:
            spans += json.load(source)
    sys.stderr.write("phase spans in this process (ms from the first import):\n")
    for pid, label, began, ended in sorted(spans, key=lambda span: span[2]):
        if pid == PARENT and label in ("imports", "walk", "shared pass", "caller-search rounds", "tree pass"):
            sys.stderr.write(f"  {label:24s} {began * 1e3:7.1f} - {ended * 1e3:7.1f}  ({(ended - began) * 1e3:.1f})\n")
    for pid in sorted({span[0] for span in spans}, key=lambda p: p != PARENT):
        totals: dict[str, float] = defaultdict(float)
        for span_pid, label, began, ended in spans:
            if span_pid == pid:
                totals[label] += ended - began
        side = "this process" if pid == PARENT else "the child"
        sys.stderr.write(f"{side}, time in each timed part (ms; nested parts counted in their own line too):\n")
        for label, total in totals.items():
            sys.stderr.write(f"  {label:24s} {total * 1e3:7.1f}\n")
    _exit(code)


os._exit = write_and_exit
sys.argv = ["canary-instrument", "check", "--no-cache", srt]
cli.run()
