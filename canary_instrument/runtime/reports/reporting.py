"""Violations from the ring to the user: decode the records, label them with their step, then log them
or keep them to raise, and keep the ones ``flush()`` returns.

A flood stays readable and cheap: at most ``lines_per_step`` violations a step, and ``lines_per_interval``
a summary interval, are logged in full, and the first of each new class (reasons, kernel, group) always
is; the rest are counted into a summary line every ``summary_interval`` steps (summary.py), records are
decoded into objects only where a line, the sink or ``flush()`` needs one, and the totals stay exact.
Raise mode raises at the end of the step that read the first violation, with a bounded message.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Optional

from canary_instrument.runtime.errors import CanaryViolationError
from canary_instrument.runtime.reports.readback import DelayedReadback, Snapshot
from canary_instrument.runtime.passes.state import KERNEL_SWEEP
from canary_instrument.runtime.passes.status import PublishedWords
from canary_instrument.runtime.step.steps import STEPS_REMEMBERED
from canary_instrument.runtime.reports.summary import Window, by_reason, count_values, distinct
from canary_instrument.runtime.reports.violations import Violation

logger = logging.getLogger("canary_instrument.runtime")

MAX_KEPT_VIOLATIONS = 100_000  # violations kept for flush(); older ones only counted


class ReasonCounts:
    """Violation records read so far, by reason, for the stats line (counted by their reason bits; the
    arrays of reason bits read since the last count are folded in when the line asks)."""

    def __init__(self) -> None:
        self.bits: Counter = Counter()
        self._pending: list = []

    def add(self, bits) -> None:
        self._pending.append(bits)

    def as_tuple(self) -> tuple:
        if self._pending:
            import numpy as np

            self.bits.update(count_values(np.concatenate(self._pending)))
            self._pending = []
        return by_reason(self.bits)


class Reporter:
    """Reads new ring records as violations and reports them in the manager's mode (log or raise)."""

    def __init__(self, *, mode: str, ring_size: int, readback: DelayedReadback, published: PublishedWords,
                 lines_per_step: int = 8, lines_per_interval: int = 32, summary_interval: int = 100, sink=None,
                 line_format: str = "canary"):
        self._raise = mode == "raise"
        self._ring_size = ring_size
        self._readback = readback
        self._published = published
        self._lines_per_step = lines_per_step
        self._lines_per_interval = lines_per_interval
        self._summary_interval = summary_interval
        self._sink = sink
        self._sglang_lines = line_format == "sglang"
        self.reasons = ReasonCounts()
        self.logged_total = 0  # violations logged in full
        self._classes: set = set()  # (reason bits, kernel, group) already logged in full
        self._step_lines = (-1, 0)  # (step, violations logged in full for it)
        self._window = Window()
        self._window_start: Optional[int] = None
        self._sweep_steps: deque = deque(maxlen=STEPS_REMEMBERED)  # steps that launched a sweep slice
        self._kept: list = []  # (records, their steps) read since the last flush(), at most MAX_KEPT_VIOLATIONS
        self._kept_rows = 0
        self._kept_dropped = 0
        self._pending: list[Violation] = []
        self._pending_lines: list[str] = []

    def note_sweep(self, step: int) -> None:
        """Step ``step`` launched a sweep slice: its records are labelled with it."""
        self._sweep_steps.append(step)

    def read(self, count: int, step: int, snapshot: Optional[Snapshot]) -> None:
        """Decode ring records [seen, count) as violations of ``step`` (sweep records: of the sweep's step)."""
        import numpy as np

        ring = self._readback.read_ring(snapshot).numpy()
        ring_size = ring.shape[0]
        seen = self._published.mark_read(count)
        first = max(seen, count - ring_size)
        if first >= count and first == seen:
            return
        records = ring[np.arange(first, count) % ring_size]
        sweep_step = self._sweep_step_before(step) if snapshot is None and self._sweep_steps else step
        self._report(records, first - seen, step, sweep_step)

    def _sweep_step_before(self, step: int) -> int:
        """The last step before ``step`` that launched a sweep slice: a sweep runs at the end of its
        step, so the first forward that can reveal its records is the next step's."""
        found = step
        for swept in self._sweep_steps:
            if swept >= step:
                break
            found = swept
        return found

    def _report(self, records, dropped: int, step: int, sweep_step: int) -> None:
        """``records``: the new ring records, an int64 array of one record a row, counted and summarised
        with numpy; only those logged, kept or sunk become ``Violation`` objects."""
        import numpy as np

        n = len(records)
        bits = records[:, 6]
        self.reasons.add(bits.copy())
        full_index = self._full_lines(records, step)
        steps = np.where(records[:, 0] == KERNEL_SWEEP, sweep_step, step)

        def violations(index) -> list[Violation]:
            return [Violation.from_record(records[i].tolist(), int(steps[i])) for i in index]

        logged = violations(full_index)
        if self._sink is not None:
            self._sink.write(violations(range(n)), dropped, step)
        kept_room = max(0, MAX_KEPT_VIOLATIONS - self._kept_rows)
        if kept_room:  # kept as records; decoded when flush() asks
            self._kept.append((records[:kept_room].copy(), steps[:kept_room].copy()))
            self._kept_rows += min(n, kept_room)
        self._kept_dropped += max(0, n - kept_room)
        rest = n - len(full_index)
        if self._raise:
            # The step's violations go up in one error; its message is bounded like the log.
            self._pending.extend(logged)
            if dropped:
                self._pending_lines.append(self._dropped_line(dropped, step))
            if rest:
                self._pending_lines.append(f"... and {rest} more violations at step {step}")
            return
        window = self._window
        if self._window_start is None:
            self._window_start = step
        if dropped and not window.dropped:  # the interval's first drop in full; the summary counts them all
            logger.error("%s", self._dropped_line(dropped, step))
        window.dropped += dropped
        window.logged += len(logged)
        window.withhold(np.delete(records, full_index, axis=0) if full_index else records, step)
        self.logged_total += len(logged)
        for v in logged:
            logger.error("%s", v.format_sglang() if self._sglang_lines else v.format())

    def _full_lines(self, records, step: int) -> list[int]:
        """Which records are logged in full: the first of each (reasons, kernel, group) class not logged
        before, then the first others while the step's and the interval's bounds leave room."""
        import numpy as np

        keys = (records[:, 6] << 8) | (records[:, 0] << 2) | (records[:, 1] >> 1)
        new = [key for key in distinct(keys).tolist() if key not in self._classes]
        self._classes.update(new)
        full = {int(np.argmax(keys == key)) for key in new}
        if self._step_lines[0] != step:
            self._step_lines = (step, 0)
        room = min(self._lines_per_step - self._step_lines[1], self._lines_per_interval - self._window.logged)
        i = 0
        while room > 0 and i < len(records):
            if i not in full:
                full.add(i)
                room -= 1
            i += 1
        index = sorted(full)
        self._step_lines = (step, self._step_lines[1] + len(index))
        return index

    def _dropped_line(self, dropped: int, step: int) -> str:
        return (f"kv_canary violations dropped: {dropped} records at step {step} exceeded the ring "
                f"(KV_CANARY_RING_SIZE={self._ring_size}); counted in the totals, never decoded")

    @property
    def interval_open(self) -> bool:
        """Whether a summary interval has begun (a violation was withheld) and not been summarised yet."""
        return self._window_start is not None

    def end_step(self, step: int) -> None:
        """A summary of what the interval withheld, once ``summary_interval`` steps have passed since it began."""
        start = self._window_start
        if start is not None and step - start >= self._summary_interval:
            self.summarise()

    def summarise(self) -> None:
        """Log the summary of the interval so far if it withheld anything, and start a new interval."""
        window, self._window, self._window_start = self._window, Window(), None
        if not window.empty:
            logger.error("%s", window.line().format())

    def take_kept(self) -> list[Violation]:
        """The violations read since the last call (``flush()``'s result); the interval's summary is logged."""
        self.summarise()
        out = [Violation.from_record(row, int(at)) for records, steps in self._kept
               for row, at in zip(records.tolist(), steps.tolist())]
        self._kept, self._kept_rows = [], 0
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

