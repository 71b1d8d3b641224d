"""Run work on two cores: this process and a forked child.

`check` reads, scans and parses a whole tree on a cold run; this spreads that work over the two
cores a pre-commit gate can count on. The child starts with the catalog, the cache and every
module already loaded, and takes its first item at once. Forked by hand (`os.fork` and pipes),
not by the standard library's process pool: the pool's imports, its queues and threads delay its
worker's first item by a large part of a cold check (bench/check/RESULTS.md, "The second core").
Where fork is unavailable or unsafe (threads running), or the work is small, it runs serially.

A `Pair` keeps its child for several steps, so that a later step can run where an earlier one left
its data (check's caller search runs over the bytes each side read, instead of this process
reading the child's half of the tree again). `map_two` forks a child of its own for one map.
"""

from __future__ import annotations

import os
import pickle
import struct
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


_HEADER = struct.Struct("<Q")
_TOKEN = struct.Struct("<I")
_MAX_TOKENS = 2048  # a pipe holds this many 4-byte tokens before anyone reads (16 KiB buffers on some systems)


class Pair:
    """This process (side 0) and, while the pair is open, a forked child (side 1) that stays between steps.

    The child is forked by the first `map`, whose items the two sides then take from one queue, the
    heaviest first, each the next one as soon as it is free: the weights only order the work, so
    they need not say exactly what an item costs (a parse and a site analysis cost a hundred times
    a byte scan of the same size). The functions the child may run are named when the pair is
    made, so the child runs its own copies over its own memory: what a step computed there stays
    there for the next step. A function must give the same result on either side (memory only
    spares it work), so that when there is no child (small work, no fork) or the child fails, this
    process runs the child's share itself. Use it as a context manager; closing it ends the child.
    """

    def __init__(self, functions: dict[str, Callable], weight: int) -> None:
        self.functions = functions
        self.pid: int | None = None
        self._ending: int | None = None  # a child told to end and not yet reaped (`close`)
        self._requests = self._replies = None
        self._fork = weight >= MIN_WEIGHT and _can_fork()

    @property
    def forked(self) -> bool:
        """Whether a child is there to take a share (else both sides run here)."""
        return self.pid is not None

    def _start(self, name: str, items: Sequence, chunks: list[list[int]]) -> list | None:
        """Fork the child, the two sides sharing `items` chunk by chunk from a queue; this side's
        [(index, result)], or None when the fork failed (nothing computed yet)."""
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        queue_read, queue_write = os.pipe()
        tokens = memoryview(b"".join(_TOKEN.pack(number) for number in range(len(chunks))))
        while tokens:
            tokens = tokens[os.write(queue_write, tokens):]
        os.close(queue_write)  # every token is in: a side that reads the end of the queue is done
        try:
            pid = os.fork()
        except OSError:
            for fd in (request_read, request_write, reply_read, reply_write, queue_read):
                os.close(fd)
            return None
        if pid == 0:  # the child: take its share, then serve requests until the pair closes; no cleanup
            status = 1
            try:
                self.pid = os.getpid()  # the child's side is forked too: what it runs shares no core
                os.close(request_write)
                os.close(reply_read)
                replies = os.fdopen(reply_write, "wb")
                _reply(replies, lambda: self._take(name, items, chunks, queue_read, packed=True))
                self._serve(os.fdopen(request_read, "rb"), replies)
                status = 0
            finally:
                os._exit(status)
        os.close(request_read)
        os.close(reply_write)
        self.pid = pid
        self._requests = os.fdopen(request_write, "wb")
        self._replies = os.fdopen(reply_read, "rb")
        return self._take(name, items, chunks, queue_read)

    def _take(self, name: str, items: Sequence, chunks: list[list[int]], queue: int, packed: bool = False) -> list:
        """Compute the chunks this side takes from the queue until it is empty: [(index, result)]. The
        child (`packed`) pickles each result as it is done, while the queue still shares the work, rather
        than all of them at the end while this process waits for them."""
        function = self.functions[name]
        done = []
        try:
            while token := os.read(queue, _TOKEN.size):  # a read of the pipe takes a whole token or none
                for index in chunks[_TOKEN.unpack(token)[0]]:
                    value = function(items[index])
                    done.append((index, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if packed else value))
        finally:
            os.close(queue)
        return done

    def _serve(self, requests, replies) -> None:
        while True:
            message = _receive(requests)
            if message is None:
                return
            name, calls = message
            function = self.functions[name]
            _reply(replies, lambda: [function(*args) for args in calls])

    def _ask(self, name: str, calls: list[tuple]) -> None:
        """Send the child its share (nothing to do when there is no child)."""
        if self.pid is None:
            return
        try:
            _send(self._requests, (name, calls))
        except OSError:
            self.close()

    def _answer(self, name: str, calls: list[tuple]) -> tuple[list, int]:
        """(The child's results for `calls`, 1), or (the same computed here, 0) when it cannot give them."""
        if self.pid is not None:
            values = self._child_reply()
            if values is not None and len(values) == len(calls):
                return values, 1
            self.close()
        function = self.functions[name]
        return [function(*args) for args in calls], 0

    def map(self, name: str, items: Sequence, weights: Sequence[int]) -> tuple[list, list[int]]:
        """([functions[name](item) for item in items], the side that computed each). The first map of a
        pair that forks shares its items through a queue; later ones split them by weight."""
        function = self.functions[name]
        results: list = [None] * len(items)
        sides = [0] * len(items)
        if self.pid is None and self._fork and len(items) >= 2:
            self._fork = False
            order = sorted(range(len(items)), key=lambda i: -weights[i])
            size = -(-len(order) // _MAX_TOKENS)  # items per chunk: one, unless there are very many
            chunks = [order[start : start + size] for start in range(0, len(order), size)]
            mine = self._start(name, items, chunks)
            if mine is not None:
                done = set()
                for index, value in mine:
                    results[index] = value
                    done.add(index)
                rest = [i for i in range(len(items)) if i not in done]
                values, side = self._answer_indexed(rest)
                for index in rest:
                    if index in values:
                        results[index], sides[index] = values[index], side
                    else:
                        results[index] = function(items[index])
                return results, sides
        if self.pid is None or len(items) < 2:
            return [function(item) for item in items], sides
        mine, theirs = split(weights)
        calls = [(items[i],) for i in theirs]
        self._ask(name, calls)
        for index in mine:
            results[index] = function(items[index])
        values, side = self._answer(name, calls)
        for index, value in zip(theirs, values):
            results[index] = value
            sides[index] = side
        return results, sides

    def _answer_indexed(self, wanted: list[int]) -> tuple[dict, int]:
        """The child's {index: result} of the first map, with side 1; ({}, 0) when it cannot give them
        (this process then computes them)."""
        pairs = self._child_reply()
        if pairs is not None:
            values = {index: pickle.loads(value) for index, value in pairs}  # packed by the child's `_take`
            if all(index in values for index in wanted):
                return values, 1
        self.close()
        return {}, 0

    def _child_reply(self):
        """The child's next results, or None where it failed or its reply cannot be read (the caller then
        closes the pair and computes them here)."""
        try:
            message = _receive(self._replies)
        except Exception:  # noqa: BLE001 - an unreadable reply: the child is of no further use
            return None
        return message[1] if message is not None and message[0] == "ok" else None

    def both(self, name: str, mine: tuple, theirs: tuple) -> tuple:
        """(functions[name](*mine) here, functions[name](*theirs) in the child), run at the same time."""
        self._ask(name, [theirs])
        here = self.functions[name](*mine)
        return here, self._answer(name, [theirs])[0][0]

    def close(self, wait: bool = True) -> None:
        """End the child: it reads the end of its requests and leaves. `wait=False` lets it end while this
        process goes on (its exit costs a few milliseconds); a later `close()` reaps it."""
        if self.pid is not None:
            self._ending, self.pid = self.pid, None
            for stream in (self._requests, self._replies):
                try:
                    stream.close()
                except OSError:
                    pass
        if wait and self._ending is not None:
            pid, self._ending = self._ending, None
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _send(stream, message) -> None:
    """`message` to `stream` as one length-prefixed pickle (`_receive` reads it)."""
    _write(stream, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _reply(stream, compute: Callable[[], object]) -> None:
    """In the child: ("ok", compute()) to the parent, or ("failed", None) where computing or pickling the
    results raised (the parent then does the share itself)."""
    try:
        body = pickle.dumps(("ok", compute()), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - reported as a failure
        body = pickle.dumps(("failed", None))
    _write(stream, body)


def _write(stream, body: bytes) -> None:
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _receive(stream):
    """One length-prefixed pickle from `stream`; None at its end."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def map_two(fn: Callable[[T], R], items: Sequence[T], weights: Sequence[int]) -> list[R]:
    """[fn(item) for item in items], the lighter-weight half computed in a forked child.

    A plain fork, as the pair's: see the module's docstring."""
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
