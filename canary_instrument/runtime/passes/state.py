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
# Request identity, write side and freed slots (docs/architecture.md, "Request identity and the write side").
IDENTITY = 64
WRITE_SLOT = 128
FREED = 256
# A verified row misses a piece it must hold: a zero link (never written, or zeroed), or a zero
# fingerprint word where the design says one is due (docs/kernels.md, "Complete rows").
UNWRITTEN = 512
# Bits of a row that no field uses are set: the token word's high 32 bits (tokens are 32-bit).
ROW_BITS = 1024
# Token oracle (runtime/features/token_oracle.py): a written input id past the prompt differs from the oracle's token.
ORACLE = 2048
REASON_NAMES = {
    POSITION: "position",
    LINK: "link",
    FINGERPRINT: "fingerprint",
    TOKEN: "token",
    SWA_UNMAPPED: "swa_unmapped",
    PADDING_SLOT: "padding_slot",
    IDENTITY: "identity",
    WRITE_SLOT: "write_slot",
    FREED: "freed",
    UNWRITTEN: "unwritten",
    ROW_BITS: "row_bits",
    ORACLE: "oracle",
}

# A canary row whose slot the KV allocator freed carries this position until its next writer rewrites it.
FREED_POSITION = -2
# Identity table (CanaryState.identity): int64 [req-pool rows, 3] = (position, token, link) of the row the
# request's last forward wrote at the position it keeps; position -1 = none yet (a row just allocated).
IDENTITY_FIELDS = 3
# PlanInputs.identity: which new position a forward records in the identity table.
IDENTITY_OFF, IDENTITY_LAST_NEW, IDENTITY_FIRST_NEW = 0, 1, 2

# PlanInputs.min_prefix when no row is told apart by its length (every row with a nonzero req-pool index is real).
MIN_PREFIX_ANY = -(1 << 62)

# Kernel ids in violation records.
KERNEL_PRE = 1
KERNEL_POST = 2
KERNEL_SWEEP = 3  # idle-cache sweep (runtime/features/sweep.py); its records carry req_pool_index -1
KERNEL_ORACLE = 4  # the token oracle's input check (runtime/features/token_oracle.py), in the pre-forward bracket
KERNEL_NAMES = {KERNEL_PRE: "pre_forward", KERNEL_POST: "post_forward", KERNEL_SWEEP: "sweep",
                KERNEL_ORACLE: "token_oracle"}

GROUP_FULL = 0
GROUP_SWA = 1
HALF_K = 0
HALF_V = 1


@dataclass
class CanaryGroup:
    """Canary rows for one (group, half) of a pool."""

    group: int  # GROUP_FULL or GROUP_SWA
    half: int  # HALF_K or HALF_V
    rows: "torch.Tensor"  # int64 [num_slots, 4]: token, position, link, fingerprint
    # Layer 0's real KV rows of this half viewed as int64 words [num_slots, words]; None if real-KV mode is none.
    kv_words: Optional["torch.Tensor"] = None
    # Every layer's rows of this half, the same geometry as kv_words (kv_layers[0] is kv_words); None = layer 0
    # only. Set with runtime.passes.layers.attach_layers, which also fills the two fields below.
    kv_layers: Optional[list] = None
    # int64 [layers]: each layer's data pointer, so one kernel argument reaches every layer's buffer.
    kv_layer_ptrs: Optional["torch.Tensor"] = None
    # int64 [num_slots, layers - 1]: fingerprints of layers 1.. (layer 0's is the row's own field 3); 0 = unwritten.
    layer_fingerprints: Optional["torch.Tensor"] = None
    # False for the full half of an SWA pool whose full sub-pool has no layers (a draft whose every layer is a
    # sliding-window one): its rows still keep the slots' bookkeeping, kv_words is one zero row read for every
    # slot, and no real-KV perturbation flips it.
    holds_kv: bool = True


@dataclass
class PlanInputs:
    """What one forward verifies and writes, read by the kernels from the batch's own device tensors.

    Nothing here is filled by the host per step: the tensors are the forward batch's (inside a
    CUDA graph, the graph runner's static buffers), so a replay re-derives the plan from the new
    values. Per request ``r < num_reqs``: positions ``[0, prefix)`` exist and are verified,
    ``[prefix, prefix + extend)`` are written, where ``extend = extend_const`` if it is > 0, else
    ``extend_lens[r]``, and ``prefix = prefix_lens[r] - extend`` when ``prefix_is_end`` (the batch
    gives the length after the forward), else ``prefix_lens[r]``. A row whose req-pool index is 0
    is graph padding (the engine never hands out req-pool row 0) and is skipped; so is a row whose
    ``pad_mark`` entry is negative or whose prefix is below ``min_prefix`` (graph padding that keeps a
    stale req-pool index: a draft runner's draft-extend graph, docs/runtime.md section 4).
    """

    num_reqs: int  # rows of the batch; inside a CUDA graph the captured (padded) batch size
    req_pool_indices: "torch.Tensor"  # any int dtype, [>= num_reqs]; 0 = padding row
    prefix_lens: "torch.Tensor"  # any int dtype, [>= num_reqs]
    extend_lens: Optional["torch.Tensor"]  # any int dtype, [>= num_reqs]; unused when extend_const > 0
    enabled: "torch.Tensor"  # int32 [1], one per manager: 0 until init has finished (warm-up, capture)
    extend_const: int = 0  # > 0: every request writes this many positions (decode 1, target verify its drafts)
    prefix_is_end: bool = False
    # Sampled-token table (target): compare the first new position of each request with the token
    # the sampler produced for its row (decode forwards only).
    check_sampled: bool = False
    # Draft worker: verify positions p < prefix - margin against the target's token at p + 1; -1 = off.
    target_margin: int = -1
    # With target_margin >= 0: only the last ``target_window`` of those positions (0 = all of them).
    target_window: int = 0
    # Pre-forward: check the link of the verified rows [0, prefix) (the rows written this forward are always
    # checked by the post-forward pass). Off on a chain step of a multi-layer EAGLE draft (plan.py).
    prefix_links: bool = True
    # Graph padding told by the batch itself: rows whose entry here is negative (any int dtype, [>= num_reqs];
    # None = no mark), and rows whose prefix is below min_prefix.
    pad_mark: Optional["torch.Tensor"] = None
    min_prefix: int = MIN_PREFIX_ANY
    # Request identity: IDENTITY_LAST_NEW (extend, decode: every new position is kept), IDENTITY_FIRST_NEW
    # (target verify: only the first is; the rest are draft guesses), IDENTITY_OFF (draft worker).
    identity: int = 0
    # Write side: the slots the forward writes its new tokens' KV to, one per input id (the batch's
    # ``out_cache_loc``); None = not checked.
    out_cache_loc: Optional["torch.Tensor"] = None


@dataclass
class CanaryState:
    """Everything the pre/post-forward kernels need, per model runner."""

    layout: str  # "mha" | "mla" | "swa"
    realkv: str  # "none" | "partial" | "all"
    groups: list[CanaryGroup]
    req_to_token: "torch.Tensor"  # int32 [max_reqs, max_context]
    token_offset: int  # 1 on an EAGLE draft worker (draft slot p holds token p + 1), else 0
    # Target: the token the sampler produced for each req-pool row, [max_reqs], -1 = none. The
    # post-forward pass of a decode checks the row it wrote at the request's first new position
    # against it, and every post-forward pass consumes (clears) the entries of its requests.
    sampled_tokens: Optional["torch.Tensor"] = None
    # Target with a sampler: int32 [cap], the sampler's output after the last forward, in that forward's
    # batch order (the host's one copy per sample), -1 = none; and int64 [cap + 1], the req-pool rows of
    # that forward's batch, left by its pre-forward pass, with their count at [cap]. The next pre-forward
    # pass files staging into ``sampled_tokens`` under those rows and clears it.
    sample_staging: Optional["torch.Tensor"] = None
    sample_rows: Optional["torch.Tensor"] = None
    # Draft worker: the target's FULL-group K canary rows [slots, 4] (same req_to_token, same slot
    # numbers); the pre-forward pass checks the token of draft position p against the target's p + 1.
    target_rows: Optional["torch.Tensor"] = None
    # int64 [max_reqs]: per req-pool row, which layer its next pre-forward pass fingerprints with realkv=partial
    # (value % layers of the group); the post-forward pass advances the entries of the requests it wrote for.
    # None: layer 0 only.
    layer_cursor: Optional["torch.Tensor"] = None
    swa_mapping: Optional["torch.Tensor"] = None  # int64 [full_slots]; SWA only
    swa_window: int = 0  # W: the SWA group verifies only the last W positions
    ring: Optional["torch.Tensor"] = None  # int64 [ring_size, 8] violation records
    ring_count: Optional["torch.Tensor"] = None  # int64 [1] cumulative violation count
    # int64 [4]: pre runs, post runs, slots verified (all groups), slots written (all groups)
    counters: Optional["torch.Tensor"] = None
    # int64 [2]: verified entries of the FULL and SWA groups (SWA divergence reporter)
    group_verified: Optional["torch.Tensor"] = None
    # int64 [n]: the manager's whole status vector (ring_count, counters and group_verified are views of it).
    status: Optional["torch.Tensor"] = None
    # int64 [n + slots], host-visible (pinned host memory on CUDA): every post-forward pass leaves a copy
    # of ``status`` in [0, n), then the packed word ``ring_count & 0xFFFFFFFF | post_runs << 32`` in one
    # store at [n + post_runs % slots], so the host reads results with no device op (status.py).
    # None: no publish.
    published: Optional["torch.Tensor"] = None
    publish_done: Optional["torch.Tensor"] = None  # int64 [1] device: programs of the running pass checked in
    # Target: int64 [req-pool rows, IDENTITY_FIELDS], the request-identity table (None = no identity check).
    identity: Optional["torch.Tensor"] = None
    # Target with the KV free wrapped: int64 [capacity], the slots freed since the last pre-forward pass (0 =
    # no entry), appended by the host (runtime/checks/request_side.py); each pre-forward op marks their FULL rows
    # freed and empties it first, inside the forward's graph when captured.
    freed: Optional["torch.Tensor"] = None
    extra: dict = field(default_factory=dict)
