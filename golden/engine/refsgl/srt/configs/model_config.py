"""ModelConfig: the shape of one model (target or EAGLE draft), derived from ServerArgs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from refsgl.srt.server_args import ServerArgs


@dataclass(frozen=True)
class ModelConfig:
    attention_layout: str  # mha | mla | swa
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    sliding_window_size: Optional[int]  # set for swa only
    is_draft: bool = False
    # Positions the model must embed (its rotary table's length): the engine's max_context_len.
    context_len: int = ServerArgs.max_context_len

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> "ModelConfig":
        return cls(
            attention_layout=args.attention_layout,
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            num_hidden_layers=args.num_hidden_layers,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            head_dim=args.head_dim,
            kv_lora_rank=args.kv_lora_rank,
            qk_rope_head_dim=args.qk_rope_head_dim,
            sliding_window_size=args.sliding_window_size if args.attention_layout == "swa" else None,
            context_len=args.max_context_len,
        )

    @classmethod
    def for_draft(cls, target: "ModelConfig") -> "ModelConfig":
        """One-layer EAGLE head; hybrid SWA targets get a full-attention draft, as in sglang."""
        layout = "mha" if target.attention_layout == "swa" else target.attention_layout
        return dataclasses.replace(
            target, attention_layout=layout, num_hidden_layers=1, sliding_window_size=None, is_draft=True
        )

    @property
    def swa_layer_ids(self) -> list[int]:
        """Hybrid SWA: odd layers use the sliding window, even layers attend to everything."""
        if self.attention_layout != "swa":
            return []
        return [i for i in range(self.num_hidden_layers) if i % 2 == 1]

    @property
    def full_layer_ids(self) -> list[int]:
        swa = set(self.swa_layer_ids)
        return [i for i in range(self.num_hidden_layers) if i not in swa]
