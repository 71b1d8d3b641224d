"""Run work on two cores: this process and the one worker of a standard-library process pool.

`check` reads, scans and parses a whole tree on a cold run; this spreads that work over the two
cores a pre-commit gate can count on. The pool forks its worker (the `fork` start method):
the worker then starts with the catalog, the cache and every module already loaded, where a
spawned one would import and rebuild them first. Where fork is unavailable or unsafe (threads
running), or the work is small, everything runs in this process.

A `Pair` keeps its worker for several steps, so that a later step can run where an earlier one
left its data (check's caller search runs over the bytes each side read, instead of this process
reading the worker's half of the tree again). `map_two` forks a child of its own for one map.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_WEIGHT = 4_000_000  # below this much work (bytes to read or scan), a fork costs more than it saves

# The pair whose worker is being forked: the worker inherits it (functions need not be picklable,
# and the first map's shared counter can only be handed over by inheritance).
_forking: Pair | None = None
_worker: Pair | None = None  # in the worker: its copy of the pair, for every step


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


def _worker_take(name: str, items: Sequence, chunks: list[list[int]]) -> tuple[int, list]:
    """In the worker: its share of the first map, and its pid (to tell the caller it is not this process)."""
    global _worker
    _worker = _forking
    _worker.pid = os.getpid()  # the worker's side of the pair is forked too: what it runs shares no core
    return os.getpid(), _worker._take(name, items, chunks)


def _worker_call(name: str, calls: list[tuple]) -> list:
    """In the worker: a later step's share, run over the worker's own memory."""
    function = _worker.functions[name]
    return [function(*args) for args in calls]


class Pair:
    """This process (side 0) and, while the pair is open, a pool worker (side 1) that stays between steps.

    The worker is forked by the first `map`, whose items the two sides then take from one shared
    counter, the heaviest first, each the next one as soon as it is free: the weights only order
    the work, so they need not say exactly what an item costs (a parse and a site analysis cost a
    hundred times a byte scan of the same size). The functions the worker may run are named when
    the pair is made, so the worker runs its own copies over its own memory: what a step computed
    there stays there for the next step. A function must give the same result on either side
    (memory only spares it work), so that when there is no worker (small work, no fork) or the
    worker fails, this process runs the worker's share itself. Use it as a context manager;
    closing it ends the worker.
    """

    def __init__(self, functions: dict[str, Callable], weight: int) -> None:
        self.functions = functions
        self.pid: int | None = None
        self._pool = None
        self._counter = None
        self._fork = weight >= MIN_WEIGHT and _can_fork()

    @property
    def forked(self) -> bool:
        """Whether a worker is there to take a share (else both sides run here)."""
        return self.pid is not None

    def _take(self, name: str, items: Sequence, chunks: list[list[int]]) -> list:
        """Compute the chunks this side takes from the shared counter until none is left: [(index, result)]."""
        function = self.functions[name]
        done = []
        while True:
            with self._counter.get_lock():
                number = self._counter.value
                self._counter.value = number + 1
            if number >= len(chunks):
                return done
            for index in chunks[number]:
                done.append((index, function(items[index])))

    def _start(self, name: str, items: Sequence, chunks: list[list[int]]):
        """Fork the worker, the two sides sharing `items` chunk by chunk; (this side's [(index, result)],
        the worker's future), or None when the pool could not start (nothing computed yet)."""
        global _forking
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("fork")
        self._counter = context.Value("q", 0)
        _forking = self
        try:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context)
            future = self._pool.submit(_worker_take, name, items, chunks)  # forks the worker
        except OSError:
            _forking = None
            self._shutdown()
            return None
        _forking = None
        return self._take(name, items, chunks), future

    def map(self, name: str, items: Sequence, weights: Sequence[int]) -> tuple[list, list[int]]:
        """([functions[name](item) for item in items], the side that computed each). The first map of a
        pair that forks shares its items through a counter; later ones split them by weight."""
        function = self.functions[name]
        results: list = [None] * len(items)
        sides = [0] * len(items)
        if self._pool is None and self._fork and len(items) >= 2:
            self._fork = False
            order = sorted(range(len(items)), key=lambda i: -weights[i])
            started = self._start(name, items, [[index] for index in order])
            if started is not None:
                mine, future = started
                done = set()
                for index, value in mine:
                    results[index] = value
                    done.add(index)
                theirs = self._result(future)
                if theirs is not None:
                    self.pid, values = theirs
                    for index, value in values:
                        results[index], sides[index] = value, 1
                        done.add(index)
                for index in range(len(items)):
                    if index not in done:  # the worker failed: its share is done here
                        results[index] = function(items[index])
                return results, sides
        if self.pid is None or len(items) < 2:
            return [function(item) for item in items], sides
        mine, theirs = split(weights)
        calls = [(items[i],) for i in theirs]
        future = self._ask(name, calls)
        for index in mine:
            results[index] = function(items[index])
        values, side = self._answer(name, calls, future)
        for index, value in zip(theirs, values):
            results[index] = value
            sides[index] = side
        return results, sides

    def both(self, name: str, mine: tuple, theirs: tuple) -> tuple:
        """(functions[name](*mine) here, functions[name](*theirs) in the worker), run at the same time."""
        future = self._ask(name, [theirs])
        here = self.functions[name](*mine)
        return here, self._answer(name, [theirs], future)[0][0]

    def _ask(self, name: str, calls: list[tuple]):
        """Send the worker its share: its future (None when there is no worker)."""
        if self.pid is None:
            return None
        try:
            return self._pool.submit(_worker_call, name, calls)
        except Exception:  # noqa: BLE001 - a broken pool: the worker is of no further use
            self.close()
            return None

    def _answer(self, name: str, calls: list[tuple], future) -> tuple[list, int]:
        """(The worker's results for `calls`, 1), or (the same computed here, 0) when it cannot give them."""
        values = self._result(future) if future is not None else None
        if values is not None and len(values) == len(calls):
            return values, 1
        self.close()
        function = self.functions[name]
        return [function(*args) for args in calls], 0

    def _result(self, future):
        """The future's result; None (and the pool closed) when the worker failed."""
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - the worker raised or died: this process does its share
            self.close()
            return None

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)  # the worker leaves and is reaped

    def close(self) -> None:
        self.pid = None
        self._shutdown()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def map_two(fn: Callable[[T], R], items: Sequence[T], weights: Sequence[int]) -> list[R]:
    """[fn(item) for item in items], the lighter-weight half computed in a forked child.

    A plain fork, not a pool: this one map runs once per caller-search round of a warm run, where a
    pool's imports and start cost more than the map saves (bench/check/RESULTS.md)."""
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
