"""Graph memory-pool helpers shared by the graph runners (the decode runner moved to runner/).

Inputs live in static buffers; replay copies the batch into them (padding the rest
with slot 0 / request row 0) so every replay reads and writes the same addresses.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable

import torch

from refsgl.srt.layers.logits_processor import LogitsProcessorOutput
from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:  # pragma: no cover
    from refsgl.srt.model_executor.model_runner import ModelRunner

_global_graph_memory_pool = None


def get_global_graph_memory_pool():
    return _global_graph_memory_pool


def set_global_graph_memory_pool(pool):
    global _global_graph_memory_pool
    _global_graph_memory_pool = pool


def get_batch_sizes_to_capture(max_bs: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, max_bs + 1, 8))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})
