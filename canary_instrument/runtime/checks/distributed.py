"""Combine per-rank canary verdicts through the engine's existing torch.distributed process group.

Under tensor or pipeline parallelism every rank guards its own KV shard. Every rank calls
``combine`` at the same step (the step count is the same on every rank), so the collective
never deadlocks; a rank defers its own raise to that point, so no rank leaves the others
waiting in a collective and a failure on one rank is raised on all of them.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.errors import CanaryHealthError, CanaryViolationError

logger = logging.getLogger("canary_instrument.runtime")

# Per-rank record: violations so far, unhealthy flag, slots written so far.
_FIELDS = 3

# Upper bound on waiting for gloo's worker thread to drop the collective's tensors.
_RELEASE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RankReport:
    rank: int
    violations: int
    unhealthy: bool
    written: int


def find_process_group(model_runner: Any) -> Optional[Any]:
    """The engine's group: an explicit ``canary_process_group``, sglang's ``tp_group``, else WORLD."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    explicit = getattr(model_runner, "canary_process_group", None)
    if explicit is not None:
        return explicit
    tp_group = getattr(model_runner, "tp_group", None)
    for attr in ("cpu_group", "device_group"):
        group = getattr(tp_group, attr, None)
        if group is not None:
            return group
    if tp_group is not None and _is_process_group(tp_group):
        return tp_group
    return dist.group.WORLD


def _is_process_group(obj: Any) -> bool:
    import torch.distributed as dist

    return isinstance(obj, dist.ProcessGroup)


def group_size(group: Optional[Any]) -> int:
    import torch.distributed as dist

    if group is None:
        return 1
    return dist.get_world_size(group)


def combine(group: Any, violations: int, unhealthy: bool, written: int) -> list[RankReport]:
    """Every rank's report, gathered on every rank (a collective: all ranks must call it)."""
    import torch.distributed as dist

    rows = _all_gather_row(group, [violations, int(unhealthy), written])
    size = len(rows)
    ranks = dist.get_process_group_ranks(group) if hasattr(dist, "get_process_group_ranks") else range(size)
    return [
        RankReport(rank=int(rank), violations=row[0], unhealthy=bool(row[1]), written=row[2])
        for rank, row in zip(ranks, rows)
    ]


def _all_gather_row(group: Any, row: list[int]) -> list[list[int]]:
    """``row`` of every rank of ``group``, in group order.

    A gloo collective hands its tensors to a worker thread, which drops its references after
    the caller's wait has returned. Dropping a reference to a tensor that Python also holds
    takes the GIL; if the interpreter is already finalizing (a rank that exits right after
    the check, as a raise does) the thread is unwound inside a noexcept destructor and the
    process aborts ("terminate called without an active exception"). So the tensors are
    handed over entirely and this returns only once the worker thread has let go of them.
    """
    import torch
    import torch.distributed as dist

    nccl = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    gathered = [torch.zeros(_FIELDS, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    rows = [[int(x) for x in t.tolist()] for t in gathered]
    if not nccl:
        # NCCL's watchdog releases finished work on its own polling schedule; waiting for it
        # would stall the step, so only gloo's worker thread is waited for.
        handed_over = [weakref.ref(t) for t in (mine, *gathered)]
        del mine, gathered
        _wait_released(handed_over)
    return rows


def _wait_released(refs: list) -> None:
    """Sleep (which lets a waiting thread take the GIL) until no tensor in ``refs`` is alive."""
    deadline = time.monotonic() + _RELEASE_TIMEOUT_S
    while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
        time.sleep(0.0005)


@dataclass(frozen=True)
class RankVerdict:
    """What one exchange found: the unhealthy ranks, and the ranks with violations when any are new."""

    step: int
    sick: list
    total: int
    new_on: Optional[list]  # ranks with violations, when the total grew since the last exchange

    def raise_if_bad(self, raise_mode: bool) -> None:
        """Every rank raises what any rank found (raise mode: violations too)."""
        if self.sick:
            raise CanaryHealthError(
                f"kv canary health check failed on rank(s) {self.sick} (combined at step {self.step})")
        if raise_mode and self.new_on is not None:
            raise CanaryViolationError(
                [], [f"kv_canary violations on rank(s) {self.new_on}: {self.total} in all ranks"])


class RankCheck:
    """The cross-rank check of one manager: a collective every ``interval`` steps, the same steps on every rank."""

    def __init__(self, group: Any, interval: int):
        self._group = group
        self.interval = interval
        self._total_seen = 0

    def exchange(self, step: int, violations: int, unhealthy: bool, written: int) -> RankVerdict:
        """Gather every rank's figures (a collective) and log the combined line on the lowest rank."""
        import torch.distributed as dist

        reports = combine(self._group, violations, unhealthy, written)
        total = sum(r.violations for r in reports)
        grew = total > self._total_seen
        self._total_seen = total
        sick = [r.rank for r in reports if r.unhealthy]
        if dist.get_rank() == min(r.rank for r in reports):
            logger.info(
                "kv_canary ranks: step=%d ranks=%d violations=%d written=%d unhealthy_ranks=%s",
                step, len(reports), total, sum(r.written for r in reports), sick,
            )
        return RankVerdict(step, sick, total, [r.rank for r in reports if r.violations > 0] if grew else None)
