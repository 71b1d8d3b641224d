"""Engines measured in turns: several live engines on one machine, one of them working at a time.

Engines run one after another meet the machine at different times: the Llama-3.2-1B's step at one request is
short enough that the host sets it, and engines started minutes apart ran the same code at 530 and 750 tokens/s
for seconds of their lives. In turns, every engine runs its share of each shape (one rep, a short and a long run)
before any runs its next, so a change of the machine's own during the call lands on all of them alike. A mode of
one engine's own (its process slow for a stretch while the others, in the same seconds, are not) it cannot
remove; the cost page's ``cost-1b-turns`` section shows both.

The turn is a counter in a file that every engine's process shares: engine ``index`` of ``count`` works while
the counter modulo ``count`` is its index, then adds one. A process that fails writes ``stop`` there, and the
others raise at their next wait rather than wait for a turn that never comes.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

STOP = "stop"


class Turns:
    def __init__(self, path: Path | None, index: int = 0, count: int = 1, stall_s: float = 300.0):
        if not 0 <= index < count:
            raise ValueError(f"turns: engine {index} of {count}")
        self.path, self.index, self.count, self.stall_s = path, index, count, stall_s

    @classmethod
    def parse(cls, path: Path | None, spec: str) -> Turns:
        """``spec`` is ``INDEX/COUNT`` (``0/4``: the first of four engines)."""
        index, _, count = spec.partition("/")
        return cls(path, int(index), int(count))

    @contextlib.contextmanager
    def turn(self):
        """Wait for this engine's turn, work, then hand the turn on. No file: every turn is this engine's."""
        if self.path is None:
            yield
            return
        counter = self._wait()
        yield
        tmp = self.path.with_name(f"{self.path.name}.{self.index}")
        tmp.write_text(str(counter + 1))
        os.replace(tmp, self.path)  # the others never read half a number

    def stop(self) -> None:
        """Tell the other engines this one will take no more turns."""
        if self.path is not None:
            tmp = self.path.with_name(f"{self.path.name}.{self.index}")
            tmp.write_text(STOP)
            os.replace(tmp, self.path)

    def _wait(self) -> int:
        seen, since = None, time.monotonic()
        while True:
            text = self.path.read_text().strip()
            if text == STOP:
                raise RuntimeError(f"turns: another engine stopped ({self.path})")
            counter = int(text)
            if counter % self.count == self.index:
                return counter
            if counter != seen:  # the others are moving: wait on
                seen, since = counter, time.monotonic()
            elif time.monotonic() - since > self.stall_s:
                raise RuntimeError(f"turns: the counter stayed at {counter} for {self.stall_s:.0f} s ({self.path})")
            time.sleep(0.001)
