"""Named points where test tooling (fault injection, tracing) may observe or alter a running engine.

Points: `batch_built` (a target ForwardBatch, before its forward), `draft_extend_batch`
(an EAGLE draft-extend ForwardBatch and the scheduler's batch it came from, before its
forward), `step_end` (after a scheduler step has committed its tokens). With nothing registered a point costs one dict lookup.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

POINTS = ("batch_built", "draft_extend_batch", "step_end")


class DebugHooks:
    def __init__(self):
        self._hooks: dict[str, list[Callable]] = defaultdict(list)

    def register(self, point: str, fn: Callable) -> Callable[[], None]:
        """Add `fn(**kwargs)` at `point`; returns a function that removes it again."""
        if point not in POINTS:
            raise ValueError(f"unknown debug hook point {point!r}; expected one of {POINTS}")
        self._hooks[point].append(fn)
        return lambda: self._hooks[point].remove(fn)

    def fire(self, point: str, **kwargs):
        for fn in list(self._hooks.get(point, ())):
            fn(**kwargs)
