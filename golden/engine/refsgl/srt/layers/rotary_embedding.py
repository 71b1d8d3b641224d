"""NeoX-style rotary position embedding over a cos/sin table built once, indexed by each token's position."""

from __future__ import annotations

import torch

from refsgl.srt.layers.custom_op import CustomOp


class RotaryEmbedding(CustomOp):
    """Rotates pairs (i, i + rotary_dim / 2) of every head by position-dependent angles, in place.

    `cos_sin_cache[p]` holds cos | sin of p * base^(-i / half) for every position p < max_position (the engine's
    context length, which no position reaches). It is a buffer, so `model.to(dtype)` rounds it to the model's
    dtype once, where recomputing it per call would redo the same ~16 ops in every layer.
    """

    def __init__(self, rotary_dim: int, max_position: int, base: float = 10000.0):
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"RotaryEmbedding: rotary_dim must be even, got {rotary_dim}")
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        half = rotary_dim // 2
        inv_freq = base ** (-torch.arange(half, dtype=torch.float32) / half)
        angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin_cache", torch.cat((angles.cos(), angles.sin()), dim=-1), persistent=False)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query [tokens, q_heads, rotary_dim], key [tokens, k_heads, rotary_dim] (views allowed): rotated in place,
        and returned."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(-2).chunk(2, dim=-1)
        half = self.rotary_dim // 2
        for x in (query, key):
            x1, x2 = x[..., :half], x[..., half:]
            x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
        return query, key

    def forward_triton(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        from refsgl.srt.layers import elementwise  # Triton: imported on the first CUDA call only

        elementwise.rotary_embedding_neox_(positions, query, key, self.cos_sin_cache)
        return query, key
