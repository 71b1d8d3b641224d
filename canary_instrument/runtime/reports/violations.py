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
        if "launch_tag" in values:
            return cls._from_sglang(values)
        return cls(reasons=frozenset(values["reason"].split(",")), req_pool_index=int(values["req"]),
                   **{name: values[name] for name in ("kernel", "group", "half")},
                   **{name: int(values[name]) for name in ("slot", "position", "stored", "expected", "step")})

    def as_dict(self) -> dict:
        """The violation as one JSON object (the structured sink's)."""
        return {"kernel": self.kernel, "group": self.group, "half": self.half,
                "reasons": sorted(self.reasons, key=_reason_order), "slot": self.slot, "position": self.position,
                "stored": self.stored, "expected": self.expected, "req": self.req_pool_index, "step": self.step}

    # sglang's own canary's line (its test helpers parse `launch_tag=` and `fail_reason=`), for a team that
    # keeps its tooling: its launch tags name the pass as head (before the forward), tail (after) or sweep,
    # then the half and the group; its reasons say verify or write. A reason it has no name for keeps ours.
    def format_sglang(self) -> str:
        tag = f"{_SGLANG_PASS.get(self.kernel, self.kernel.upper())}_{self.half.upper()}_{self.group.upper()}"
        reasons = "+".join(_sglang_reason(r, self.kernel) for r in sorted(self.reasons, key=_reason_order))
        return (f"{PREFIX} launch_tag={tag} fail_reason={reasons} slot_idx={self.slot} position={self.position} "
                f"stored={self.stored} expected={self.expected} req={self.req_pool_index} step={self.step}")

    @classmethod
    def _from_sglang(cls, values: dict) -> "Violation":
        pass_, half, group = values["launch_tag"].rsplit("_", 2)
        kernel = next((ours for ours, theirs in _SGLANG_PASS.items() if theirs == pass_), pass_.lower())
        reasons = frozenset(_FROM_SGLANG.get(r, r) for r in values["fail_reason"].split("+"))
        return cls(kernel=kernel, group=group.lower(), half=half.lower(), reasons=reasons,
                   slot=int(values["slot_idx"]), position=int(values["position"]), stored=int(values["stored"]),
                   expected=int(values["expected"]), req_pool_index=int(values["req"]), step=int(values["step"]))


_SGLANG_PASS = {"pre_forward": "HEAD", "post_forward": "TAIL", "sweep": "SWEEP", "token_oracle": "HEAD"}
_FROM_SGLANG = {"verify_position": "position", "write_position": "position", "verify_chain_hash": "link",
                "verify_real_kv_hash": "fingerprint", "verify_token": "token", "write_token": "token"}


def _sglang_reason(reason: str, kernel: str) -> str:
    if reason == "token":
        return "write_token" if kernel == "post_forward" else "verify_token"
    if reason == "oracle":
        return "write_token"  # sglang's token-oracle input check reports write_token
    return {"position": "verify_position", "link": "verify_chain_hash", "fingerprint": "verify_real_kv_hash"}.get(
        reason, reason)


def _reason_order(name: str) -> int:
    for bit, known in REASON_NAMES.items():
        if known == name:
            return bit
    return 1 << 30
