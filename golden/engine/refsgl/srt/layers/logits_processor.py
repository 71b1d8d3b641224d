"""LM head output: next-token logits plus the final hidden states EAGLE feeds its draft model."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [num_selected_tokens, vocab]
    hidden_states: torch.Tensor  # [num_tokens, hidden] (all tokens of the forward)


def select_logit_positions(forward_batch) -> torch.Tensor | None:
    """Token indices whose logits are needed: the last of each request for plain extend, else all."""
    if forward_batch.forward_mode.is_extend() and forward_batch.num_tokens_per_req is None:
        return torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1
    return None
