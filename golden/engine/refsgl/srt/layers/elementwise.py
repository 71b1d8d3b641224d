"""Triton kernels for the model's per-token elementwise layers: RMSNorm (optionally fused with the residual add)
and NeoX rotary embedding, one launch each where plain torch issues 6-8 ops per call.

Only the CUDA path of `layernorm.RMSNorm` and `rotary_embedding.RotaryEmbedding` imports this module, so CPU
engines never load Triton. Both kernels size their grid from host shapes only and read positions from device
memory: no host read, safe inside a captured CUDA graph. Arithmetic is in fp32 with one rounding to the
tensor's dtype at the store.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    X, Residual, ResidualOut, Out, Weight,
    stride_x, stride_r, stride_ro, stride_o,
    hidden, eps, residual_scale,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        # Round the sum to the stream's dtype first and normalise the rounded value, as the torch path does,
        # so the residual stream and the normalised input agree.
        h = (r + residual_scale * x).to(ResidualOut.dtype.element_ty)
        tl.store(ResidualOut + row * stride_ro + cols, h, mask=ok)
        x = h.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    w = tl.load(Weight + cols, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.math.rsqrt(mean_square + eps) * w
    tl.store(Out + row * stride_o + cols, y.to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _rotate_heads(X, token, pos_cos, pos_sin, stride_t, stride_h, num_heads,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    ok = (heads[:, None] < num_heads) & (dims[None, :] < HALF)
    first = X + token * stride_t + heads[:, None] * stride_h + dims[None, :]
    x1 = tl.load(first, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=ok, other=0.0).to(tl.float32)
    tl.store(first, (x1 * pos_cos[None, :] - x2 * pos_sin[None, :]).to(X.dtype.element_ty), mask=ok)
    tl.store(first + HALF, (x2 * pos_cos[None, :] + x1 * pos_sin[None, :]).to(X.dtype.element_ty), mask=ok)


@triton.jit
def _rotary_neox_kernel(
    Q, K, CosSin, Positions,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    q_heads, k_heads,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    cos = tl.load(CosSin + pos * stride_cs + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    sin = tl.load(CosSin + pos * stride_cs + HALF + dims, mask=dims < HALF, other=0.0).to(tl.float32)
    _rotate_heads(Q, token, cos, sin, stride_qt, stride_qh, q_heads, HALF, BLOCK_HQ, BLOCK_D)
    _rotate_heads(K, token, cos, sin, stride_kt, stride_kh, k_heads, HALF, BLOCK_HK, BLOCK_D)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(elements: int) -> int:
    return max(1, min(8, elements // 256))


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: Optional[torch.Tensor] = None,
    residual_scale: float = 1.0,
):
    """x [tokens, hidden] -> x / rms(x) * weight. With `residual`, first h = residual + residual_scale * x and
    normalise h; returns (normalised h, h). Rows may be strided; the hidden dim must be contiguous."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: x must be [tokens, hidden] with weight [hidden]; got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"rmsnorm: residual {tuple(residual.shape)} {residual.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    for name, t in (("x", x), ("weight", weight), ("residual", residual)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"rmsnorm: {name} needs a contiguous last dimension")
    tokens, hidden = x.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else out
    if tokens:
        block = _next_pow2(hidden)
        r = residual if residual is not None else x  # placeholder pointer when unused
        _rmsnorm_kernel[(tokens,)](
            x, r, residual_out, out, weight,
            x.stride(0), r.stride(0), residual_out.stride(0), out.stride(0),
            hidden, eps, residual_scale,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block),
        )
    return out if residual is None else (out, residual_out)


def rotary_embedding_neox_(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           cos_sin_cache: torch.Tensor) -> None:
    """Rotate query [tokens, q_heads, rot] and key [tokens, k_heads, rot] in place: pairs (i, i + rot/2) of each
    head by the angles of the token's position, read from cos_sin_cache [max_position, rot] (cos | sin halves).
    Both may be strided views (e.g. into a fused projection's output); the last dim must be contiguous."""
    tokens, q_heads, rot = query.shape
    if key.dim() != 3 or key.shape[0] != tokens or key.shape[2] != rot or positions.shape != (tokens,):
        raise ValueError(f"rotary_embedding: query {tuple(query.shape)}, key {tuple(key.shape)} and positions "
                         f"{tuple(positions.shape)} disagree on tokens or rotary dim")
    if rot % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rot:
        raise ValueError(f"rotary_embedding: cos_sin_cache {tuple(cos_sin_cache.shape)} does not hold an even "
                         f"rotary dim {rot}")
    for name, t in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"rotary_embedding: {name} needs a contiguous last dimension")
    if tokens == 0:
        return
    half = rot // 2
    k_heads = key.shape[1]
    block_d = _next_pow2(half)
    _rotary_neox_kernel[(tokens,)](
        query, key, cos_sin_cache, positions,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        q_heads, k_heads,
        HALF=half, BLOCK_HQ=_next_pow2(q_heads), BLOCK_HK=_next_pow2(k_heads), BLOCK_D=block_d,
        num_warps=_warps(_next_pow2(q_heads) * block_d),
    )
