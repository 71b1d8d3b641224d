"""Decoded violation records and their one-line, parseable log format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from canary_instrument.runtime.reports.loglines import LogLine
from canary_instrument.runtime.passes.state import GROUP_SWA, HALF_V, KERNEL_NAMES, REASON_NAMES

PREFIX = "kv_canary violation:"
_GROUP_NAMES = {0: "full", GROUP_SWA: "swa"}
_HALF_NAMES = {0: "k", HALF_V: "v"}


@dataclass(frozen=True)
class Violation(LogLine):
    """One failed check of one canary row, as a user reads it."""

    PREFIX = PREFIX
    LINE_NAME = "kv_canary violation"

    kernel: str  # "pre_forward" | "post_forward"
    group: str  # "full" | "swa"
    half: str  # "k" | "v"
    slot: int
    position: int
    stored: int  # value of the first failing field, in reason-bit order
    expected: int
    reasons: frozenset  # of REASON_NAMES values
    req_pool_index: int
    step: int  # the manager's forward step in which the kernel recorded it

    @classmethod
    def from_record(cls, record: Sequence[int], step: int) -> "Violation":
        kernel, group_half, slot, position, stored, expected, bits, req = (int(x) for x in record[:8])
        return cls(
            kernel=KERNEL_NAMES.get(kernel, f"kernel{kernel}"),
            group=_GROUP_NAMES.get(group_half // 2, f"group{group_half // 2}"),
            half=_HALF_NAMES.get(group_half % 2, f"half{group_half % 2}"),
            slot=slot,
            position=position,
            stored=stored,
            expected=expected,
            reasons=frozenset(name for bit, name in REASON_NAMES.items() if bits & bit)
            or frozenset({f"bits{bits}"}),
            req_pool_index=req,
            step=step,
        )

    def fields(self) -> list:
        reason = ",".join(sorted(self.reasons, key=_reason_order))
        return [("kernel", self.kernel), ("group", self.group), ("half", self.half), ("reason", reason),
                ("slot", self.slot), ("position", self.position), ("stored", self.stored),
                ("expected", self.expected), ("req", self.req_pool_index), ("step", self.step)]

    @classmethod
    def from_fields(cls, fields: list) -> "Violation":
        values = dict(fields)
        return cls(reasons=frozenset(values["reason"].split(",")), req_pool_index=int(values["req"]),
                   **{name: values[name] for name in ("kernel", "group", "half")},
                   **{name: int(values[name]) for name in ("slot", "position", "stored", "expected", "step")})


def _reason_order(name: str) -> int:
    for bit, known in REASON_NAMES.items():
        if known == name:
            return bit
    return 1 << 30
