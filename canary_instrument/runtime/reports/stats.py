"""Periodic stats as one parseable line, and a warning when the canary is on but its kernels never ran.

The stats line, every ``kv_canary_stats_interval`` steps:

```
kv_canary_stats= step=200 tokens_protected=2560 verified=81234 written=5120 pre_runs=200 post_runs=200 violations=3 reasons=position:1,fingerprint:2 swept=40960 sweep_passes=3 sweep_pass_rows=1024 logged=3
```

``tokens_protected``/``verified``/``written``/``pre_runs``/``post_runs``/``violations`` are the
device counters as of that step's snapshot (``tokens_protected``: tokens whose KV carries canary
rows, i.e. rows written / rows per token);
``reasons`` counts the violation records read so far by reason (a record with several reasons
counts once for each; records dropped by a full ring are in ``violations`` only); ``swept`` is
the rows the idle-cache sweep verified, ``sweep_passes`` its completed passes over the cache and
``sweep_pass_rows`` how far the current pass has got; ``logged`` the violations logged in full (the
rest of a flood is in the summary lines, reports/summary.py).

``EnableWarner`` is the health check's softer twin. The health check raises when planned canary
passes did not run; this warns, once, when the canary is enabled but nothing at all ran after
the first forwards: ``mark_init_finished()`` never called (the canary does nothing until it is),
or every batch since init planned nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.reports.loglines import LogLine

logger = logging.getLogger("canary_instrument.runtime")

PREFIX = "kv_canary_stats="
_INTS = ("step", "tokens_protected", "verified", "written", "pre_runs", "post_runs", "violations", "swept",
         "sweep_passes", "sweep_pass_rows")


@dataclass(frozen=True)
class StatsLine(LogLine):
    PREFIX = PREFIX

    step: int
    verified: int
    written: int
    violations: int
    reasons: tuple = ()  # ((reason, count), ...) in reason-bit order, zero counts left out
    swept: int = 0
    sweep_passes: int = 0
    sweep_pass_rows: int = 0
    tokens_protected: int = 0
    pre_runs: int = 0
    post_runs: int = 0
    logged: int = 0

    def reason_count(self, reason: str) -> int:
        return dict(self.reasons).get(reason, 0)

    def fields(self) -> list:
        reasons = ",".join(f"{name}:{count}" for name, count in self.reasons) or "-"
        return [*((name, getattr(self, name)) for name in _INTS[:7]), ("reasons", reasons),
                *((name, getattr(self, name)) for name in _INTS[7:]), ("logged", self.logged)]

    @classmethod
    def from_fields(cls, fields: list) -> "StatsLine":
        values = dict(fields)
        ints = {name: int(values[name]) for name in _INTS}
        raw = values["reasons"]
        reasons = () if raw == "-" else tuple((n, int(c)) for n, c in (item.split(":") for item in raw.split(",")))
        return cls(reasons=reasons, logged=int(values.get("logged", 0)), **ints)


class EnableWarner:
    """Warns once if, ``after_forwards`` forwards into a canary-enabled run, no canary pass has run."""

    def __init__(self, after_forwards: int = 32):
        if after_forwards < 1:
            raise ValueError(f"kv canary: the enable warning needs after_forwards >= 1; got {after_forwards}")
        self.after_forwards = after_forwards
        self.warned: Optional[str] = None
        self.settled = False  # kernels were seen running after enough steps: nothing left to warn about

    @property
    def done(self) -> bool:
        """True once ``observe`` can no longer warn (the manager then stops calling it)."""
        return self.warned is not None or self.settled

    def observe(self, *, forwards: int, init_finished: bool, steps: int = 0, planned: int = 0,
                pre_runs: int = 0, post_runs: int = 0) -> Optional[str]:
        """Call after each forward the manager sees (``forwards`` counts them since install, warm-up included;
        ``steps``/``planned``/runs are as of the last snapshot read). Returns the warning when it is given."""
        if self.done or forwards < self.after_forwards:
            return None
        if not init_finished:
            message = (
                f"kv canary is enabled but mark_init_finished() was not called after {forwards} forwards: canary "
                "passes stay disabled until it is (is the init-finished hook wired? run `canary-instrument check`)"
            )
        elif steps >= self.after_forwards and (pre_runs or post_runs):
            self.settled = True
            return None
        elif steps >= self.after_forwards:
            message = (
                f"kv canary is enabled but no canary kernel ran in {steps} steps since init ({planned} sub-forwards "
                "planned): every batch was idle or planned nothing, so the KV cache is not being checked"
            )
        else:
            return None
        self.warned = message
        logger.warning("%s", message)
        return message


@dataclass(frozen=True)
class CanaryStats:
    """Cumulative figures as of the last snapshot the host has read."""

    steps: int  # forward steps (outside contexts completed after init finished)
    tokens_protected: int  # tokens whose KV now carries canary rows (written / rows per token)
    verified: int  # entries verified (all groups and halves)
    written: int  # canary rows written by pre-forward, summed over groups and halves
    pre_runs: int
    post_runs: int
    violations: int

    def format(self) -> str:
        return (
            f"kv_canary stats: steps={self.steps} tokens_protected={self.tokens_protected} "
            f"verified={self.verified} written={self.written} pre_runs={self.pre_runs} "
            f"post_runs={self.post_runs} violations={self.violations}"
        )


class StatsKeeper:
    """The last status snapshot read, as ``CanaryStats`` and as the periodic stats line."""

    def __init__(self, *, interval: int, rows_per_token: int, swept_at: int):
        self.interval = interval  # steps between stats lines; 0 = none
        self._rows_per_token = rows_per_token  # every written token gets one row per (group, half)
        self._swept_at = swept_at  # the sweep's row counter in the status vector
        self.values: Any = None  # numpy copy of the last status snapshot read
        self._step = 0  # the step that snapshot belongs to
        self._logged_step = 0  # flush() re-reads the current step; its line is logged once

    def keep(self, values: Any, step: int) -> None:
        self.values = values.copy()
        self._step = step

    def last(self, seen: int) -> CanaryStats:
        """The figures of the last snapshot; violations read from the published words (``seen``) may be ahead."""
        if self.values is None:
            return CanaryStats(0, 0, 0, 0, 0, 0, seen)
        count, pre_runs, post_runs, verified, written = (int(v) for v in self.values[:5])
        return CanaryStats(self._step, written // self._rows_per_token, verified, written, pre_runs, post_runs,
                           max(count, seen))

    def line(self, last: CanaryStats, reasons: tuple, progress: Optional[tuple], logged: int = 0) -> StatsLine:
        """The stats line of ``last``, with the sweep's (passes, rows in the current pass) ``progress``."""
        swept = int(self.values[self._swept_at]) if self.values is not None else 0
        passes, pass_rows = progress if progress is not None else (0, 0)
        return StatsLine(
            step=last.steps, tokens_protected=last.tokens_protected, verified=last.verified, written=last.written,
            pre_runs=last.pre_runs, post_runs=last.post_runs, violations=last.violations,
            reasons=reasons, swept=swept, sweep_passes=passes, sweep_pass_rows=pass_rows, logged=logged,
        )

    def line_due(self, step: int) -> bool:
        """Whether the snapshot of ``step`` logs a stats line (once per interval)."""
        interval = self.interval
        if interval and step // interval > self._logged_step // interval:
            self._logged_step = step
            return True
        return False
