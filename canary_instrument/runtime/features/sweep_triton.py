"""Launch the rendered idle-cache sweep kernel (kernels/sweep_*.py): one launch, fixed grid.

The row count is read on the device, so a launch can be captured in a CUDA graph; the kernels
come from the same place as the per-forward passes (``triton_ops.kernels_dir``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...codegen.linemap import annotate
from ...codegen.specs import PARTIAL_WORDS, spec_for
from ..passes.state import CanaryState
from .sweep_buffers import SweepBuffers
from ..passes.triton_ops import kernels_dir, layer_args, load_kernel_module, state_spec

BLOCK = 128  # rows per tile, as the verify of the per-forward passes
NUM_WARPS = 4
PROGRAMS_PER_SM = 4  # a slice is at most a few ten thousand rows: fewer programs than a full verify
MAX_FP_CHUNK = 32


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TritonSweepOps:
    """The Triton backend of the sweep; identical results to ``sweep_reference.TorchSweepOps``."""

    name = "triton"

    def __init__(self, block: int | None = None, programs: int | None = None, kernel_dir: Path | None = None,
                 num_warps: int | None = None):
        if block is not None and (block < 2 or block & (block - 1)):
            raise ValueError(f"TritonSweepOps(block={block}): must be a power of two >= 2")
        self.block = block or BLOCK
        self.programs = programs
        self.num_warps = num_warps or NUM_WARPS
        self.kernel_dir = Path(kernel_dir) if kernel_dir is not None else None

    def _grid(self, device: torch.device) -> int:
        if self.programs:
            return self.programs
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).multi_processor_count * PROGRAMS_PER_SM
        return 4  # the interpreter runs programs one after another

    def sweep(self, state: CanaryState, buffers: SweepBuffers) -> None:
        canary = state_spec(state)  # validates groups, rows and real-KV views as the per-forward passes do
        spec = spec_for(canary.layout, canary.v_half, canary.realkv, family="sweep")
        module = load_kernel_module(spec, self.kernel_dir)
        if buffers.rows.dtype != torch.int64 or not buffers.rows.is_contiguous() or buffers.rows.shape[1:] != (3,):
            raise ValueError("SweepBuffers.rows must be contiguous int64 [capacity, 3]")
        if state.ring is None or state.ring_count is None:
            raise ValueError("the sweep reports into CanaryState.ring and ring_count; both must be set")
        fp_words = 0
        if spec.realkv != "none":
            words = state.groups[0].kv_words.shape[1]
            fp_words = min(PARTIAL_WORDS, words) if spec.realkv == "partial" else words
        args = [buffers.count, buffers.rows, buffers.rows.shape[0], state.groups[0].rows.shape[0]]
        for g in state.groups:
            args.append(g.rows)
            if spec.realkv != "none":
                args += layer_args(g)
        if spec.layout == "swa":
            args += [state.swa_mapping, next(g.rows.shape[0] for g in state.groups if g.group == 1)]
        args += [state.ring, state.ring_count, buffers.counters]
        try:
            module.canary_sweep[(self._grid(state.req_to_token.device),)](
                *args,
                RING_SIZE=state.ring.shape[0],
                BLOCK=self.block,
                FP_WORDS=fp_words,
                FP_CHUNK=min(MAX_FP_CHUNK, _next_pow2(max(1, fp_words))),
                num_warps=self.num_warps,
            )
        except Exception as exc:
            raise annotate(exc, [str((self.kernel_dir or kernels_dir()) / spec.filename)])
