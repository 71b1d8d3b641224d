"""Violations from the ring to the user: decode the records, label them with their step, then log them
or keep them to raise, and keep the ones ``flush()`` returns."""

from __future__ import annotations

import logging
from collections import deque
from typing import Optional

from canary_instrument.runtime.errors import CanaryViolationError
from canary_instrument.runtime.reports.readback import DelayedReadback, Snapshot
from canary_instrument.runtime.passes.state import KERNEL_SWEEP
from canary_instrument.runtime.reports.stats import ReasonCounter
from canary_instrument.runtime.passes.status import PublishedWords
from canary_instrument.runtime.step.steps import STEPS_REMEMBERED
from canary_instrument.runtime.reports.violations import Violation

logger = logging.getLogger("canary_instrument.runtime")

MAX_KEPT_VIOLATIONS = 100_000  # violations kept for flush(); older ones only counted


class Reporter:
    """Reads new ring records as violations and reports them in the manager's mode (log or raise)."""

    def __init__(self, *, mode: str, ring_size: int, readback: DelayedReadback, published: PublishedWords):
        self._raise = mode == "raise"
        self._ring_size = ring_size
        self._readback = readback
        self._published = published
        self.reasons = ReasonCounter()
        self._sweep_steps: deque = deque(maxlen=STEPS_REMEMBERED)  # steps that launched a sweep slice
        self._kept: list[Violation] = []
        self._kept_dropped = 0
        self._pending: list[Violation] = []
        self._pending_lines: list[str] = []

    def note_sweep(self, step: int) -> None:
        """Step ``step`` launched a sweep slice: its records are labelled with it."""
        self._sweep_steps.append(step)

    def read(self, count: int, step: int, snapshot: Optional[Snapshot]) -> None:
        """Decode ring records [seen, count) as violations of ``step`` (sweep records: of the sweep's step)."""
        ring = self._readback.read_ring(snapshot)
        ring_size = ring.shape[0]
        seen = self._published.mark_read(count)
        first = max(seen, count - ring_size)
        rows = [ring[i % ring_size].tolist() for i in range(first, count)]
        sweep_step = self._sweep_step_before(step) if snapshot is None and self._sweep_steps else step
        violations = [Violation.from_record(row, sweep_step if row[0] == KERNEL_SWEEP else step) for row in rows]
        self._report(violations, first - seen, step)

    def _sweep_step_before(self, step: int) -> int:
        """The last step before ``step`` that launched a sweep slice: a sweep runs at the end of its
        step, so the first forward that can reveal its records is the next step's."""
        found = step
        for swept in self._sweep_steps:
            if swept >= step:
                break
            found = swept
        return found

    def _report(self, violations: list[Violation], dropped: int, step: int) -> None:
        self.reasons.add(violations)
        extra = []
        if dropped:
            extra.append(
                f"kv_canary violations dropped: {dropped} records at step {step} exceeded the ring "
                f"(KV_CANARY_RING_SIZE={self._ring_size})"
            )
        room = max(0, MAX_KEPT_VIOLATIONS - len(self._kept))
        self._kept.extend(violations[:room])
        self._kept_dropped += max(0, len(violations) - room)
        if self._raise:
            self._pending.extend(violations)
            self._pending_lines.extend(extra)
            return
        for v in violations:
            logger.error("%s", v.format())
        for line in extra:
            logger.error("%s", line)

    def take_kept(self) -> list[Violation]:
        """The violations read since the last call (``flush()``'s result)."""
        out, self._kept = self._kept, []
        if self._kept_dropped:
            logger.warning(
                "kv_canary flush: %d more violations were logged but not kept for flush() (limit %d)",
                self._kept_dropped, MAX_KEPT_VIOLATIONS,
            )
        self._kept_dropped = 0
        return out

    def raise_pending(self) -> None:
        """Raise mode: raise the violations read since the last raise, if any."""
        if self._pending or self._pending_lines:
            violations, lines = self._pending, self._pending_lines
            self._pending, self._pending_lines = [], []
            raise CanaryViolationError(violations, lines)

