"""Data handed between the EAGLE draft, verify and draft-extend stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class EagleDraftInput:
    hidden_states: torch.Tensor  # one per input token: the target's (extend) or the draft's own (chain)
    topk_index: Optional[torch.Tensor] = None  # [bs, 1] the chain's first token


@dataclass
class EagleVerifyOutput:
    accept_lens: torch.Tensor  # int64 [bs]: accepted draft tokens per request
    committed_tokens: list[list[int]]  # accepted drafts + the target's bonus token
    target_predict: torch.Tensor  # int64 [bs, num_draft_tokens]: target argmax at each verified position
    hidden_states: torch.Tensor  # target hidden states at the verified positions
