"""MergedLinear: several bias-free projections of one input as one matmul, loaded shard by shard from a checkpoint
that stores them apart (the job of sglang's QKVParallelLinear / MergedColumnParallelLinear, without the TP split)."""

from __future__ import annotations

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """`output_sizes` maps each shard's checkpoint module name (e.g. "q_proj") to its output width, in the order the
    shards are stacked along the output dim."""

    def __init__(self, input_size: int, output_sizes: dict[str, int]):
        super().__init__(input_size, sum(output_sizes.values()), bias=False)
        self.shard_names = tuple(output_sizes)
        self.output_sizes = list(output_sizes.values())

    def shard_shapes(self) -> list[tuple[str, torch.Size]]:
        return [(name, torch.Size((size, self.in_features))) for name, size in zip(self.shard_names, self.output_sizes)]

    def weight_loader(self, loaded_weight: torch.Tensor, shard_name: str) -> None:
        index = self.shard_names.index(shard_name)
        start, size = sum(self.output_sizes[:index]), self.output_sizes[index]
        if loaded_weight.shape != (size, self.in_features):
            raise ValueError(f"MergedLinear: shard {shard_name!r} expects a weight of {(size, self.in_features)}, "
                             f"got {tuple(loaded_weight.shape)}")
        with torch.no_grad():
            self.weight[start : start + size].copy_(loaded_weight)

    def split(self, output: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The shards' outputs as views of the merged output, in shard order."""
        return output.split(self.output_sizes, dim=-1)
