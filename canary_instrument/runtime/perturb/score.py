"""Score a run: which injections the canary reported, how many steps later, and what it reported beyond them.

An injection is reported by a violation of the same or a later step that names what it corrupted:

| kind | a matching violation |
|---|---|
| req_to_token | the request's position read through the remapped entry (any reason: ``position`` for the row of another position, ``swa_unmapped`` when that position's SWA slot is gone), or the next position, whose link derives from it (``link``) |
| real_kv_used, real_kv_post_forward, real_kv_unused_cache, real_kv_layer | the flipped slot, in the same group and half, reason ``fingerprint`` |
| fingerprint_zeroed | the slot, in the same group and half, reason ``unwritten`` |
| row_high_bit | the slot, in the same group and half, reason ``row_bits``; or an EAGLE draft's comparison with that target row (FULL/K), whose token word carries the flipped bit: in the draft's FULL group at the slot, or in its SWA group at the request's position before (below) |
| next_token_swap | reason ``token`` (or ``oracle``, with the token oracle on) at either swapped (request, position), or at either slot of the group (a later request that reuses the prefix), or an EAGLE draft's SWA-group comparison at either request's position before (below) |
| req_row_swap | reason ``identity``, ``link``, ``position`` or ``swa_unmapped`` of either request (the longer one reads the shorter one's slots, outside whose window the SWA group holds nothing; the shorter one's row at ``length`` chains from the other's history) |
| write_slot | reason ``write_slot`` at either swapped (request, position) |
| premature_free | reason ``freed`` at the freed slot (FULL group), or ``link`` at the next position in the same forward |

An EAGLE draft compares its row of position p with the target's FULL/K row of position p + 1 in each of its groups:
its FULL group reports where the target's row is (the target's slot and position p + 1), its SWA group at its own
row (pre-forward, ``token`` alone, group ``swa``, position p). No target pass compares tokens before its forward,
so such a line is a draft's.

Injections with ``applied=0`` changed nothing and are counted apart. So is a miss whose slot left the prefix cache
before any request held it (a ``kv_canary_perturb_left_cache=`` line names it, ``left_cache``): *evicted unread*,
nothing read the flipped bytes; the share reported is over the rest. A violation that matches no applied injection
is *unattributed*: on a healthy engine there must be none.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from canary_instrument.runtime.perturb.injection import Injection
from canary_instrument.runtime.perturb.left_cache import LeftCache
from canary_instrument.runtime.perturb.perturb_settings import KINDS
from canary_instrument.runtime.reports.violations import Violation

_REAL_KV = ("real_kv_used", "real_kv_post_forward", "real_kv_unused_cache", "real_kv_layer")
# Kinds reported at the corrupted slot, in its group and half, by one reason.
_AT_SLOT = {**{kind: "fingerprint" for kind in _REAL_KV}, "fingerprint_zeroed": "unwritten", "row_high_bit": "row_bits"}

UNATTRIBUTED_KEPT = 20  # unattributed violations listed in to_dict(); all are counted


def matches(injection: Injection, violation: Violation) -> bool:
    """Whether ``violation`` reports ``injection`` (see the module table)."""
    if violation.step < injection.step:
        return False
    reasons = violation.reasons
    if injection.kind == "req_to_token":
        if violation.req_pool_index != injection.req:
            return False
        return violation.position == injection.position or (
            violation.position == injection.position + 1 and "link" in reasons
        )
    if injection.kind in _AT_SLOT:
        if injection.kind == "row_high_bit" and _draft_compared(violation) and injection.group == "full":
            # A draft reads the target's token word, high bit and all (docs/runtime.md, "EAGLE").
            if violation.group == "full" and violation.slot == injection.slot:
                return True
            if injection.half == "k" and _draft_swa_row_before(violation, {(injection.req, injection.position)}):
                return True
        return (
            _AT_SLOT[injection.kind] in reasons
            and violation.slot == injection.slot
            and violation.group == injection.group
            and violation.half == injection.half
        )
    if injection.kind == "next_token_swap":
        if "token" not in reasons and "oracle" not in reasons:  # the oracle's input check sees a swap too
            return False
        at = {(injection.req, injection.position), (injection.get("other_req"), injection.get("other_position"))}
        if violation.group == "swa":
            slots = {injection.get("swa_slot"), injection.get("other_swa_slot")} - {None, 0}
        else:
            slots = {injection.slot, injection.get("other_slot")}
        return ((violation.req_pool_index, violation.position) in at or violation.slot in slots
                or _draft_swa_row_before(violation, at))
    if injection.kind == "req_row_swap":
        return violation.req_pool_index in (injection.req, injection.get("other_req")) and bool(
            {"identity", "link", "position", "swa_unmapped"} & set(reasons))
    if injection.kind == "write_slot":
        at = {(injection.req, injection.position), (injection.get("other_req"), injection.get("other_position"))}
        return "write_slot" in reasons and (violation.req_pool_index, violation.position) in at
    if injection.kind == "premature_free":
        if violation.group != "full":
            return False
        if "freed" in reasons and violation.slot == injection.slot:
            return True
        # The next position's link derives from the freed row (any request reading the slot as position p).
        return "link" in reasons and violation.position == injection.position + 1 and violation.step == injection.step
    return False


def _draft_compared(violation: Violation) -> bool:
    """A draft's comparison with the target's rows: ``token`` alone, found by a pre-forward pass."""
    return violation.reasons == {"token"} and violation.kernel == "pre_forward"


def _draft_swa_row_before(violation: Violation, at: set) -> bool:
    """A draft's SWA-group comparison of its row of position p with the target's row of p + 1, for p + 1 in ``at``
    ((request, position) pairs): reported at the draft's own row, p."""
    return (_draft_compared(violation) and violation.group == "swa"
            and (violation.req_pool_index, violation.position + 1) in at)


@dataclass
class KindScore:
    kind: str
    injected: int = 0
    reported: int = 0
    missed: list = field(default_factory=list)  # the Injections nothing reported (evicted unread ones apart)
    delays: list = field(default_factory=list)  # steps from injection to its first report, per reported one
    evicted: list = field(default_factory=list)  # unreported Injections whose slot left the cache unread

    @property
    def readable(self) -> int:
        """Injections something could read: the share reported is over these."""
        return self.injected - len(self.evicted)

    def delay(self, how: str) -> Optional[float]:
        if not self.delays:
            return None
        return {"min": min, "max": max, "median": statistics.median}[how](self.delays)


@dataclass
class Score:
    kinds: dict  # kind -> KindScore, every kind in KINDS order
    not_applied: int = 0
    unattributed: list = field(default_factory=list)  # Violations no applied injection explains
    violations: int = 0

    @property
    def injected(self) -> int:
        return sum(k.injected for k in self.kinds.values())

    @property
    def reported(self) -> int:
        return sum(k.reported for k in self.kinds.values())

    @property
    def evicted(self) -> int:
        return sum(len(k.evicted) for k in self.kinds.values())

    def format(self) -> str:
        lines = [f"{'kind':<22}{'injected':>9}{'reported':>9}{'missed':>7}{'evicted unread':>15}   "
                 "delay min/median/max (steps)"]
        for k in self.kinds.values():
            delay = "-" if not k.delays else f"{k.delay('min')}/{k.delay('median'):g}/{k.delay('max')}"
            lines.append(f"{k.kind:<22}{k.injected:>9}{k.reported:>9}{len(k.missed):>7}{len(k.evicted):>15}   {delay}")
        lines.append(
            f"{'all':<22}{self.injected:>9}{self.reported:>9}{self.injected - self.reported - self.evicted:>7}"
            f"{self.evicted:>15}   "
            f"violations {self.violations}, unattributed {len(self.unattributed)}, not applied {self.not_applied}"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "kinds": {
                k.kind: {"injected": k.injected, "reported": k.reported, "missed": [m.format() for m in k.missed],
                         "evicted_unread": [m.format() for m in k.evicted],
                         "delay_min": k.delay("min"), "delay_median": k.delay("median"), "delay_max": k.delay("max")}
                for k in self.kinds.values()
            },
            "injected": self.injected,
            "reported": self.reported,
            "evicted_unread": self.evicted,
            "not_applied": self.not_applied,
            "violations": self.violations,
            # A count and the first lines: a run whose real or false reports flood can leave tens of thousands.
            "unattributed": len(self.unattributed),
            "unattributed_first": [v.format() for v in self.unattributed[:UNATTRIBUTED_KEPT]],
        }


def score(injections: Iterable[Injection], violations: Iterable[Violation],
          left_cache: Iterable[LeftCache] = ()) -> Score:
    """``left_cache``: the run's ``left_cache`` lines (of the same process); a miss one names is evicted unread."""
    violations = list(violations)
    gone = {left.names for left in left_cache}
    result = Score(kinds={kind: KindScore(kind) for kind in KINDS}, violations=len(violations))
    explained = [False] * len(violations)
    for injection in injections:
        if not injection.applied:
            result.not_applied += 1
            continue
        kind = result.kinds.setdefault(injection.kind, KindScore(injection.kind))
        kind.injected += 1
        first = None
        for i, violation in enumerate(violations):
            if matches(injection, violation):
                explained[i] = True
                first = violation.step if first is None else min(first, violation.step)
        if first is None:
            unread = (injection.kind, injection.step, injection.position) in gone
            (kind.evicted if unread else kind.missed).append(injection)
        else:
            kind.reported += 1
            kind.delays.append(first - injection.step)
    result.unattributed = [v for v, ok in zip(violations, explained) if not ok]
    return result


# sglang's log prefix: the time, then the process's ranks when there are several (" TP1", " DP0 TP1", ...).
_PROCESS = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?((?: [A-Z_]+\d+)*)\] ")


def score_log(text: str) -> Score:
    """Score every ``kv_canary_perturb=``, ``kv_canary_perturb_left_cache=`` and ``kv_canary violation:`` line of a
    log.

    Each process's lines are scored on their own, then added up: tensor-parallel ranks share slot numbers but
    each injects into, and reports on, its own shard of the heads, so a report on one rank says nothing of
    another rank's injection."""
    by_process: dict[str, list[str]] = {}
    for line in text.splitlines():
        found = _PROCESS.match(line)
        by_process.setdefault(found.group(1) if found else "", []).append(line)
    scores = [score(Injection.find_all(lines), Violation.find_all(lines), LeftCache.find_all(lines))
              for lines in ("\n".join(group) for group in by_process.values())]
    return _added(scores)


def _added(scores: list[Score]) -> Score:
    total = Score(kinds={kind: KindScore(kind) for kind in KINDS})
    for one in scores:
        for kind, k in one.kinds.items():
            into = total.kinds.setdefault(kind, KindScore(kind))
            into.injected += k.injected
            into.reported += k.reported
            into.missed += k.missed
            into.evicted += k.evicted
            into.delays += k.delays
        total.not_applied += one.not_applied
        total.unattributed += one.unattributed
        total.violations += one.violations
    return total
