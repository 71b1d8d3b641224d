"""The violations a flood's bounded log withheld, summarised per interval: one parseable line with the exact
counts by reason and kernel, the distinct req-pool rows and slots, and the first and last step."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

from canary_instrument.runtime.passes.state import KERNEL_NAMES, REASON_NAMES
from canary_instrument.runtime.reports.loglines import LogLine

PREFIX = "kv_canary violation summary:"


def _counts(text: str) -> tuple:
    return () if text == "-" else tuple((n, int(c)) for n, c in (item.split(":") for item in text.split(",")))


def _text(counts: tuple) -> str:
    return ",".join(f"{name}:{count}" for name, count in counts) or "-"


@dataclass(frozen=True)
class SummaryLine(LogLine):
    """What one interval's withheld violations were, as a user reads them."""

    PREFIX = PREFIX
    LINE_NAME = "kv_canary violation summary"

    first_step: int
    last_step: int
    withheld: int  # violations read in the interval and not logged in full
    logged: int  # violations of the interval logged in full
    reasons: tuple  # ((reason, count), ...) of the withheld ones, in reason-bit order
    kernels: tuple  # ((kernel, count), ...)
    req_rows: int  # distinct req-pool rows among them
    slots: int  # distinct slots among them
    dropped: int  # records past the device ring's capacity: counted, never decoded

    def fields(self) -> list:
        return [("steps", f"{self.first_step}-{self.last_step}"), ("withheld", self.withheld),
                ("logged", self.logged), ("reasons", _text(self.reasons)), ("kernels", _text(self.kernels)),
                ("req_rows", self.req_rows), ("slots", self.slots), ("dropped", self.dropped)]

    @classmethod
    def from_fields(cls, fields: list) -> "SummaryLine":
        values = dict(fields)
        first, _, last = values["steps"].partition("-")
        return cls(first_step=int(first), last_step=int(last), withheld=int(values["withheld"]),
                   logged=int(values["logged"]), reasons=_counts(values["reasons"]),
                   kernels=_counts(values["kernels"]), req_rows=int(values["req_rows"]),
                   slots=int(values["slots"]), dropped=int(values["dropped"]))


def distinct(values):
    """The sorted distinct values of an int array (by sorting: numpy's own ``unique`` hashes, which is
    several times slower on the small integer arrays a flood brings at every step)."""
    import numpy as np

    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def count_values(values) -> dict:
    """{value: how many times} of an array of small non-negative ints (kernel ids, reason bits), by counting."""
    import numpy as np

    counts = np.bincount(values) if len(values) else np.zeros(0, dtype=np.int64)
    found = np.flatnonzero(counts)
    return dict(zip(found.tolist(), counts[found].tolist()))


def by_reason(bit_counts) -> tuple:
    """((reason, count), ...) in reason-bit order from counts by reason bits; a record with two reasons
    counts for both, reasons with no record are left out."""
    counts: Counter = Counter()
    for bits, count in bit_counts.items():
        for bit, name in REASON_NAMES.items():
            if bits & bit:
                counts[name] += count
    return tuple((name, counts[name]) for name in REASON_NAMES.values() if counts[name])


class Window:
    """The interval since the last summary: what was logged in full, and the records withheld (kept as arrays
    and counted once, when the summary is written: a flood's steps pay only for a copy)."""

    def __init__(self) -> None:
        self.first_step: Optional[int] = None
        self.last_step = 0
        self.logged = 0
        self.withheld = 0
        self.dropped = 0
        self._records: list = []  # per read: the withheld records' (kernel, slot, reason bits, req row) columns

    def note(self, step: int) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step = max(self.last_step, step)

    def withhold(self, records, step: int) -> None:
        """Count withheld ring records of `step` (an int64 array, one record a row)."""
        self.note(step)
        self.withheld += len(records)
        if len(records):
            self._records.append(records[:, [0, 2, 6, 7]])

    @property
    def empty(self) -> bool:
        return not self.withheld and not self.dropped

    def line(self) -> SummaryLine:
        import numpy as np

        columns = np.concatenate(self._records) if self._records else np.zeros((0, 4), dtype=np.int64)
        kernels = count_values(columns[:, 0]).items()
        return SummaryLine(
            first_step=self.first_step or 0, last_step=self.last_step, withheld=self.withheld, logged=self.logged,
            reasons=by_reason(count_values(columns[:, 2])),
            kernels=tuple((KERNEL_NAMES.get(k, f"kernel{k}"), c) for k, c in kernels),
            req_rows=len(distinct(columns[:, 3])), slots=len(distinct(columns[:, 1])), dropped=self.dropped,
        )
