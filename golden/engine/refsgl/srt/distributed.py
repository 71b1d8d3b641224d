"""Process-group access: refsgl runs tensor-parallel size 1, so the group is this process."""

from __future__ import annotations

import torch.distributed as dist


class GroupCoordinator:
    """The single-rank tensor-parallel group; barrier() is real when torch.distributed is up."""

    world_size = 1
    rank_in_group = 0

    def barrier(self):
        if dist.is_available() and dist.is_initialized():
            dist.barrier()


_TP_GROUP = GroupCoordinator()


def get_tp_group() -> GroupCoordinator:
    return _TP_GROUP
