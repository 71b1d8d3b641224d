"""Combine per-rank canary verdicts through the engine's existing torch.distributed process group.

Under tensor or pipeline parallelism every rank guards its own KV shard. Every rank calls
``combine`` at the same step (the step count is the same on every rank), so the collective
never deadlocks; a rank defers its own raise to that point, so no rank leaves the others
waiting in a collective and a failure on one rank is raised on all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# Per-rank record: violations so far, unhealthy flag, slots written so far.
_FIELDS = 3


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
    import torch
    import torch.distributed as dist

    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    mine = torch.tensor([violations, int(unhealthy), written], dtype=torch.int64, device=device)
    size = dist.get_world_size(group)
    gathered = [torch.zeros(_FIELDS, dtype=torch.int64, device=device) for _ in range(size)]
    dist.all_gather(gathered, mine, group=group)
    ranks = dist.get_process_group_ranks(group) if hasattr(dist, "get_process_group_ranks") else range(size)
    return [
        RankReport(rank=int(rank), violations=int(t[0]), unhealthy=bool(t[1]), written=int(t[2]))
        for rank, t in zip(ranks, (g.tolist() for g in gathered))
    ]
