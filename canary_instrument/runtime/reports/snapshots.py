"""Tagged status snapshots at step end: one taken when due, and each one read feeds the health check,
the SWA line and the stats line (and the reporter, for violations the published words have not shown).

A snapshot is one async copy and an event (``readback.py``), read when complete, never waited for,
except by ``drain`` (``flush()``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from canary_instrument.runtime.checks.health import HealthCheck
from canary_instrument.runtime.reports.readback import DelayedReadback, Snapshot
from canary_instrument.runtime.reports.reporting import Reporter
from canary_instrument.runtime.reports.stats import StatsKeeper
from canary_instrument.runtime.passes.status import PublishedWords
from canary_instrument.runtime.step.steps import StepState
from canary_instrument.runtime.reports.swa_divergence import swa_log_from_status

logger = logging.getLogger("canary_instrument.runtime")


class Tag(NamedTuple):
    """Host facts at snapshot time: step number, enabled sub-forwards planned so far, SWA report due,
    and the sweep's progress (passes, rows in the current pass) when a stats line is due."""

    step: int
    planned: int
    swa_due: bool
    sweep_progress: Optional[tuple] = None


@dataclass(kw_only=True)
class Snapshots:
    """One manager's tagged snapshots and what reads them."""

    readback: DelayedReadback
    interval: int  # steps between snapshots (more are taken where a stats or SWA line is due)
    steps: StepState
    published: PublishedWords
    reporter: Reporter
    health: HealthCheck
    stats: StatsKeeper
    stats_line: Callable[[Tag], Any]

    def read_ready(self) -> None:
        """Read earlier steps' snapshots whose copies have completed (normally just the last one taken)."""
        readback = self.readback
        while readback.pending():
            snapshot = readback.harvest()
            if snapshot is None:
                break
            self._process(snapshot)

    def take_if_due(self, step: int, swa_due: bool, stats_due: bool, progress: Optional[tuple]) -> None:
        """A snapshot every ``interval`` steps (a copy and an event record: CUDA calls), and on steps whose
        SWA or stats line is due."""
        if step % self.interval == 0 or swa_due or stats_due:
            self.readback.take(Tag(step, self.steps.planned, swa_due, progress))

    def drain(self, final: bool, poll: Callable[[], None]) -> None:
        """Wait for every snapshot in flight and read it, then ``poll`` the published words; ``final``:
        one more snapshot of the state now, read at once."""
        while self.readback.pending():
            self._process(self.readback.harvest(wait=True))
        poll()
        if final:
            self.readback.take(Tag(self.steps.step, self.steps.planned, False))
            self._process(self.readback.harvest(wait=True))

    def _process(self, snapshot: Snapshot) -> None:
        values, tag = snapshot.values, snapshot.tag
        count, pre_runs, post_runs = int(values[0]), int(values[1]), int(values[2])
        self.stats.keep(values, tag.step)
        if count > self.published.seen:
            self.reporter.read(count, self.steps.label(tag.step), snapshot)
        self.health.check(tag, pre_runs, post_runs)
        if tag.swa_due:
            logger.info("%s", swa_log_from_status(tag.step, values).format())
        self.health.observe(tag, pre_runs, post_runs, self.steps.forwards)
        if self.stats.line_due(tag.step):
            logger.info("%s", self.stats_line(tag).format())
