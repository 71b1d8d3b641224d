"""ForwardBatch: the device-side description of one forward pass, with sglang's field names.

Conventions the KV canary relies on: `seq_lens` is the length after this forward for
decode and extend modes (a decode batch's sub-forward i writes position seq_lens - 1 + i),
but the prefix length for TARGET_VERIFY (which writes `num_tokens_per_req` draft
positions after it). Extend-like modes also carry `extend_prefix_lens` / `extend_seq_lens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Any, Optional

import torch


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill or a prefill chunk
    DECODE = auto()  # one new token per request (EAGLE: one per draft step)
    MIXED = auto()  # prefill chunks and decode tokens in one extend batch
    IDLE = auto()
    TARGET_VERIFY = auto()  # the target scores a draft chain
    DRAFT_EXTEND = auto()  # the draft model catches up on verified tokens

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # int64 [num_tokens]
    req_pool_indices: torch.Tensor  # int64 [bs]
    seq_lens: torch.Tensor  # int64 [bs]
    positions: torch.Tensor  # int64 [num_tokens]
    out_cache_loc: torch.Tensor  # int64 [num_tokens]: KV slots this forward writes
    extend_prefix_lens: Optional[torch.Tensor] = None  # int64 [bs]
    extend_seq_lens: Optional[torch.Tensor] = None  # int64 [bs]
    extend_prefix_lens_cpu: Optional[list[int]] = None
    extend_seq_lens_cpu: Optional[list[int]] = None
    # Set when every request has the same number of new tokens (verify, draft-extend after verify).
    num_tokens_per_req: Optional[int] = None
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    attn_backend: Any = None
    spec_info: Any = None
