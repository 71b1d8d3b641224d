"""The seam between the runtime and the kernels: every device buffer one canary pass reads or writes.

The runtime builds these once per model runner (static addresses, so CUDA-graph replay
sees new values in the same memory); the kernel backends (Triton and the torch
reference) only read this structure. Nothing here imports torch at module import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    import torch

# Reason bits (docs/architecture.md).
POSITION = 1
LINK = 2
FINGERPRINT = 4
TOKEN = 8
SWA_UNMAPPED = 16
PADDING_SLOT = 32
REASON_NAMES = {
    POSITION: "position",
    LINK: "link",
    FINGERPRINT: "fingerprint",
    TOKEN: "token",
    SWA_UNMAPPED: "swa_unmapped",
    PADDING_SLOT: "padding_slot",
}

# Kernel ids in violation records.
KERNEL_PRE = 1
KERNEL_POST = 2
KERNEL_SWEEP = 3  # idle-cache sweep (runtime/sweep.py); its records carry req_pool_index -1
KERNEL_NAMES = {KERNEL_PRE: "pre_forward", KERNEL_POST: "post_forward", KERNEL_SWEEP: "sweep"}

GROUP_FULL = 0
GROUP_SWA = 1
HALF_K = 0
HALF_V = 1

RECORD_FIELDS = ("kernel", "group_half", "slot", "position", "stored", "expected", "reasons", "req_pool_index")


@dataclass
class CanaryGroup:
    """Canary rows for one (group, half) of a pool."""

    group: int  # GROUP_FULL or GROUP_SWA
    half: int  # HALF_K or HALF_V
    rows: "torch.Tensor"  # int64 [num_slots, 4]: token, position, link, fingerprint
    # Layer 0's real KV rows of this half viewed as int64 words [num_slots, words]; None if real-KV mode is none.
    kv_words: Optional["torch.Tensor"] = None


@dataclass
class PlanInputs:
    """Per sub-forward plan, filled outside the graph, read by kernels inside it."""

    num_reqs: "torch.Tensor"  # int32 [1]: real requests this forward (<= max_bs; the rest is graph padding)
    req_pool_indices: "torch.Tensor"  # int64 [max_bs]
    prefix_lens: "torch.Tensor"  # int32 [max_bs]: positions [0, prefix) exist and are verified pre-forward
    extend_lens: "torch.Tensor"  # int32 [max_bs]: positions [prefix, prefix + extend) are written this forward
    enabled: "torch.Tensor"  # int32 [1]: 0 during warm-up/capture before init finished


@dataclass
class CanaryState:
    """Everything the pre/post-forward kernels need, per model runner."""

    layout: str  # "mha" | "mla" | "swa"
    realkv: str  # "none" | "partial" | "all"
    groups: list[CanaryGroup]
    req_to_token: "torch.Tensor"  # int32 [max_reqs, max_context]
    # Expected-token table, int64 [max_reqs, max_context + 1], -1 = unknown; None disables the token check.
    expected_tokens: Optional["torch.Tensor"]
    token_offset: int  # 1 on an EAGLE draft worker (draft slot p holds token p + 1), else 0
    swa_mapping: Optional["torch.Tensor"] = None  # int64 [full_slots]; SWA only
    swa_window: int = 0  # W: the SWA group verifies only the last W positions
    ring: Optional["torch.Tensor"] = None  # int64 [ring_size, 8] violation records
    ring_count: Optional["torch.Tensor"] = None  # int64 [1] cumulative violation count
    # int64 [4]: pre runs, post runs, slots verified (all groups), slots written (all groups)
    counters: Optional["torch.Tensor"] = None
    # int64 [2]: verified entries of the FULL and SWA groups (SWA divergence reporter)
    group_verified: Optional["torch.Tensor"] = None
    extra: dict = field(default_factory=dict)
