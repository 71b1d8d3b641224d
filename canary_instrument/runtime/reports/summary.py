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


class Window:
    """The interval since the last summary: what was logged in full, and what was withheld, by field."""

    def __init__(self) -> None:
        self.first_step: Optional[int] = None
        self.last_step = 0
        self.logged = 0
        self.withheld = 0
        self.dropped = 0
        self.bits: Counter = Counter()  # reason bits of the withheld records -> how many
        self.kernels: Counter = Counter()
        self.req_rows: set = set()
        self.slots: set = set()

    def note(self, step: int) -> None:
        if self.first_step is None:
            self.first_step = step
        self.last_step = max(self.last_step, step)

    def withhold(self, records: list, step: int) -> None:
        """Count withheld ring records (`Reporter` record lists) of `step`."""
        self.note(step)
        self.withheld += len(records)
        self.bits.update(r[6] for r in records)
        self.kernels.update(r[0] for r in records)
        self.req_rows.update(r[7] for r in records)
        self.slots.update(r[2] for r in records)

    @property
    def empty(self) -> bool:
        return not self.withheld and not self.dropped

    def line(self) -> SummaryLine:
        reasons = Counter()
        for bits, count in self.bits.items():
            for bit, name in REASON_NAMES.items():
                if bits & bit:
                    reasons[name] += count
        order = list(REASON_NAMES.values())
        return SummaryLine(
            first_step=self.first_step or 0, last_step=self.last_step, withheld=self.withheld, logged=self.logged,
            reasons=tuple(sorted(reasons.items(), key=lambda item: order.index(item[0]))),
            kernels=tuple((KERNEL_NAMES.get(k, f"kernel{k}"), c) for k, c in sorted(self.kernels.items())),
            req_rows=len(self.req_rows), slots=len(self.slots), dropped=self.dropped,
        )
