"""RMSNorm, optionally fused with the residual add before it (sglang's `RMSNorm(x, residual)` contract)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from refsgl.srt.layers.custom_op import CustomOp


class RMSNorm(CustomOp):
    """y = x / rms(x) * weight over the last dim.

    Called as `norm(x)` it returns y. Called as `norm(x, residual, residual_scale)` it first forms the residual
    stream's next value h = residual + residual_scale * x, and returns (norm(h), h): one kernel on CUDA for what
    is otherwise an add, a scale and a six-op norm.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward_native(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None, residual_scale: float = 1.0):
        if residual is not None:
            x = residual = residual + residual_scale * x
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return out if residual is None else (out, residual)

    def forward_triton(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None, residual_scale: float = 1.0):
        from refsgl.srt.layers import elementwise  # Triton: imported on the first CUDA call only

        return elementwise.rmsnorm(x, self.weight, self.eps, residual, residual_scale)
