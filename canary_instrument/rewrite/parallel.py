"""Run a function over many items on two cores: a forked child takes about half the work.

`check` reads, scans and parses a whole tree on a cold run; this halves that wall time on the
2-core machines a pre-commit gate runs on. Fork (not a process pool) because the child then
starts with the catalog, the cache and every module already loaded, in a few milliseconds.
Where fork is unavailable or unsafe (threads running), or the work is small, it runs serially.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_WEIGHT = 4_000_000  # below this much work (bytes to read or scan), a fork costs more than it saves


def _can_fork() -> bool:
    if not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        return False
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < 2:
        return False
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def split(weights: Sequence[int]) -> tuple[list[int], list[int]]:
    """Indexes for two halves of about equal total weight (heaviest first, each to the lighter half)."""
    halves: tuple[list[int], list[int]] = ([], [])
    totals = [0, 0]
    for index in sorted(range(len(weights)), key=lambda i: -weights[i]):
        side = 0 if totals[0] <= totals[1] else 1
        halves[side].append(index)
        totals[side] += weights[index]
    return halves[0], halves[1]


def map_two(fn: Callable[[T], R], items: Sequence[T], weights: Sequence[int]) -> list[R]:
    """[fn(item) for item in items], the lighter-weight half computed in a forked child."""
    if sum(weights) < MIN_WEIGHT or len(items) < 2 or not _can_fork():
        return [fn(item) for item in items]
    mine, theirs = split(weights)
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return [fn(item) for item in items]
    if pid == 0:  # the child: compute its half, send it, and leave without running any cleanup
        status = 1
        try:
            os.close(read_end)
            body = pickle.dumps([fn(items[i]) for i in theirs], protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(body)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    results: list = [None] * len(items)
    try:
        for index in mine:
            results[index] = fn(items[index])
    finally:
        with os.fdopen(read_end, "rb") as pipe:
            body = pipe.read()
        _, status = os.waitpid(pid, 0)
    try:
        theirs_results = pickle.loads(body) if status == 0 else None
    except Exception:  # noqa: BLE001 - a child that failed half-way: do its half here
        theirs_results = None
    if theirs_results is None or len(theirs_results) != len(theirs):
        theirs_results = [fn(items[i]) for i in theirs]
    for index, value in zip(theirs, theirs_results):
        results[index] = value
    return results
