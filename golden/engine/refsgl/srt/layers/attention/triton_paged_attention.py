"""Paged flash-decoding attention in Triton: every key and value is read through `req_to_token`.

Covers the dense shapes (each request adds the same `tokens_per_req` query tokens: decode, EAGLE
draft steps, target verify, draft-extend after verify) with `TorchNativeAttnBackend`'s mask: query
token at position q sees key positions k <= q (and k > q - window on a sliding-window layer).
Sizes come from device memory (the positions tensor), the grid is fixed by host shapes only, so a
launch can be captured in a CUDA graph and replayed with new batches.

Stage 1: one program per (request, KV head, row block, split) walks its share of the request's
key range, scores all query rows of that KV head at once (GQA: T tokens x G query heads per KV
head, one `tl.dot` per key block) and keeps an online softmax. Stage 2 merges the splits' partial
outputs by their log-sum-exp. With one split, stage 1 writes the output directly.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _attend_key_block(
    q, q_pos, m_i, l_i, acc, block_start, end, req_row, kv_head, K, V, ReqToToken, SlotMapping,
    stride_ks, stride_kh, stride_vs, stride_vh, stride_r2t, qk_scale_log2, window,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_MAPPING: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """One key block [block_start, block_start + BLOCK_N) of the online softmax: returns the new (m, l, acc)."""
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_pos = block_start + tl.arange(0, BLOCK_N)
    k_ok = k_pos < end
    slot = tl.load(ReqToToken + req_row * stride_r2t + k_pos, mask=k_ok, other=0).to(tl.int64)
    if HAS_MAPPING:
        slot = tl.load(SlotMapping + slot, mask=k_ok, other=0).to(tl.int64)
    k = tl.load(
        K + slot[:, None] * stride_ks + kv_head * stride_kh + offs_dqk[None, :],
        mask=k_ok[:, None] & (offs_dqk[None, :] < D_QK),
        other=0.0,
    )
    if DOT_UPCAST:
        # Triton 3.6's interpreter multiplies bf16 dot operands as raw bits; the CPU tests upcast
        # them (exact for bf16 values). Compiled kernels never take this branch.
        scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = scores * qk_scale_log2
    visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
    if HAS_WINDOW:
        visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row that has seen no visible key yet keeps m = -inf; shift it by 0 so that
    # exp2(-inf - shift) is 0 instead of NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(scores - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    v = tl.load(
        V + slot[:, None] * stride_vs + kv_head * stride_vh + offs_dv[None, :],
        mask=k_ok[:, None] & (offs_dv[None, :] < D_V),
        other=0.0,
    )
    if DOT_UPCAST:
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, acc


@triton.jit
def _paged_attention_split_kernel(
    Q, K, V, Out, PartialOut, PartialLse,
    ReqToToken, ReqPoolIndices, Positions, SlotMapping,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_r2t,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    qk_scale_log2, window, num_splits,
    HAS_WINDOW: tl.constexpr, TOKENS_PER_REQ: tl.constexpr, GROUP: tl.constexpr, ROW_BLOCKS: tl.constexpr,
    D_QK: tl.constexpr, D_V: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MAPPING: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PIPELINED_LOOP: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1) // ROW_BLOCKS
    row_block = tl.program_id(1) % ROW_BLOCKS
    split = tl.program_id(2)

    # Query rows of this KV head: row m is token m // GROUP of the request, query head
    # kv_head * GROUP + m % GROUP (GQA keeps a KV head's query heads adjacent).
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < TOKENS_PER_REQ * GROUP
    token = req * TOKENS_PER_REQ + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    q_pos = tl.load(Positions + token, mask=row_ok, other=0).to(tl.int32)

    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_dqk[None, :],
        mask=row_ok[:, None] & (offs_dqk[None, :] < D_QK),
        other=0.0,
    )

    # Key range any query token of the request may see: [lo, hi); split it into num_splits
    # chunks of whole key blocks. Both ends come from device memory, so graph replays follow
    # the batch.
    first_pos = tl.load(Positions + req * TOKENS_PER_REQ).to(tl.int32)
    hi = first_pos + 1
    lo = first_pos
    for t in tl.static_range(1, TOKENS_PER_REQ):
        pos_t = tl.load(Positions + req * TOKENS_PER_REQ + t).to(tl.int32)
        hi = tl.maximum(hi, pos_t + 1)
        lo = tl.minimum(lo, pos_t)
    if HAS_WINDOW:
        lo = tl.maximum(lo - window + 1, 0)
    else:
        lo = 0
    split_len = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, hi)

    req_row = tl.load(ReqPoolIndices + req).to(tl.int64)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    if PIPELINED_LOOP:
        for block_start in range(start, end, BLOCK_N):
            m_i, l_i, acc = _attend_key_block(
                q, q_pos, m_i, l_i, acc, block_start, end, req_row, kv_head, K, V, ReqToToken, SlotMapping,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_r2t, qk_scale_log2, window,
                D_QK, D_V, BLOCK_DQK, BLOCK_DV, BLOCK_N, HAS_MAPPING, HAS_WINDOW, DOT_PRECISION, DOT_UPCAST,
            )
    else:
        # Triton's interpreter (CPU tests) cannot take a tensor as a range() bound; the compiled
        # kernel keeps the for loop, which Triton software-pipelines.
        block_start = start
        while block_start < end:
            m_i, l_i, acc = _attend_key_block(
                q, q_pos, m_i, l_i, acc, block_start, end, req_row, kv_head, K, V, ReqToToken, SlotMapping,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_r2t, qk_scale_log2, window,
                D_QK, D_V, BLOCK_DQK, BLOCK_DV, BLOCK_N, HAS_MAPPING, HAS_WINDOW, DOT_PRECISION, DOT_UPCAST,
            )
            block_start += BLOCK_N

    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if DIRECT:
        tl.store(
            Out + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_dv[None, :],
            out.to(Out.dtype.element_ty),
            mask=row_ok[:, None] & (offs_dv[None, :] < D_V),
        )
    else:
        tl.store(
            PartialOut + token[:, None] * stride_pt + head[:, None] * stride_ph + split * stride_ps
            + offs_dv[None, :],
            out,
            mask=row_ok[:, None] & (offs_dv[None, :] < D_V),
        )
        lse = tl.where(has_keys, m_i + tl.math.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(PartialLse + token * stride_lt + head * stride_lh + split, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    Out, PartialOut, PartialLse,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    num_splits,
    D_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    s_ok = offs_s < num_splits
    lse = tl.load(PartialLse + token * stride_lt + head * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    # Every row sees its own position, so at least one split has a finite log-sum-exp.
    weight = tl.math.exp2(lse - tl.max(lse, axis=0))
    part = tl.load(
        PartialOut + token * stride_pt + head * stride_ph + offs_s[:, None] * stride_ps + offs_dv[None, :],
        mask=s_ok[:, None] & (offs_dv[None, :] < D_V),
        other=0.0,
    )
    out = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(Out + token * stride_ot + head * stride_oh + offs_dv, out.to(Out.dtype.element_ty), mask=offs_dv < D_V)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_blocking(tokens_per_req: int, group: int) -> tuple[int, int]:
    """(BLOCK_M, row blocks) for the T x G query rows of one KV head; tl.dot needs at least 16 rows."""
    rows = tokens_per_req * group
    block_m = min(64, max(16, _next_pow2(rows)))
    return block_m, triton.cdiv(rows, block_m)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: str) -> int:
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def choose_num_splits(batch_size: int, kv_heads: int, row_blocks: int, max_context: int, device,
                      block_n: int = 64, max_splits: int = 64) -> int:
    """Splits per request so the grid fills the device about 4 programs deep, never shorter than a block.

    Host shapes only (no tensor is read), so the choice is fixed for a captured graph.
    """
    if torch.device(device).type == "cuda":
        programs = 4 * _multiprocessors(str(device))
    else:
        return 1  # Triton's interpreter runs programs one after another: more of them only cost time
    splits = triton.cdiv(programs, max(1, batch_size * kv_heads * row_blocks))
    return max(1, min(splits, max_splits, triton.cdiv(max_context, block_n)))


def paged_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    positions: torch.Tensor,
    *,
    tokens_per_req: int,
    sm_scale: float,
    num_splits: int,
    window: Optional[int] = None,
    slot_mapping: Optional[torch.Tensor] = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of `tokens_per_req` query tokens per request over its paged KV.

    q [bs * T, Hq, D_qk] (request-major: token i * T + t is request i's t-th), k_buffer
    [slots, Hkv, D_qk], v_buffer [slots, Hkv, D_v] (last dim contiguous; views allowed),
    req_to_token [rows, max_context] int32, req_pool_indices [bs], positions [bs * T] (the query
    tokens' positions; each attends to the key positions <= its own), slot_mapping maps
    req_to_token's slots into the buffers' (SWA layers). Returns [bs * T, Hq, D_v] in q's dtype.
    """
    num_tokens, q_heads, d_qk = q.shape
    kv_heads, d_v = k_buffer.shape[1], v_buffer.shape[2]
    if tokens_per_req < 1 or num_tokens % tokens_per_req:
        raise ValueError(f"paged_attention: {num_tokens} query tokens do not split into {tokens_per_req} per request")
    batch_size = num_tokens // tokens_per_req
    if req_pool_indices.shape[0] != batch_size or positions.shape[0] != num_tokens:
        raise ValueError(
            f"paged_attention: {batch_size} requests x {tokens_per_req} tokens need req_pool_indices of "
            f"{batch_size} and positions of {num_tokens}; got {req_pool_indices.shape[0]} and {positions.shape[0]}"
        )
    if k_buffer.shape[2] != d_qk or v_buffer.shape[1] != kv_heads or q_heads % kv_heads:
        raise ValueError(
            f"paged_attention: q {tuple(q.shape)} does not fit k_buffer {tuple(k_buffer.shape)} / "
            f"v_buffer {tuple(v_buffer.shape)} (query heads must be a multiple of KV heads)"
        )
    if not (q.dtype == k_buffer.dtype == v_buffer.dtype):
        raise ValueError(f"paged_attention: q, k and v dtypes differ ({q.dtype}, {k_buffer.dtype}, {v_buffer.dtype})")
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("req_to_token", req_to_token)):
        if t.stride(-1) != 1:
            raise ValueError(f"paged_attention: {name} needs a contiguous last dimension")
    if num_splits < 1:
        raise ValueError(f"paged_attention: num_splits must be >= 1, got {num_splits}")
    if window is not None and window < 1:
        raise ValueError(f"paged_attention: a sliding window must be >= 1 position, got {window}")

    group = q_heads // kv_heads
    block_m, row_blocks = row_blocking(tokens_per_req, group)
    out = torch.empty((num_tokens, q_heads, d_v), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    direct = num_splits == 1
    if direct:
        partial_out = partial_lse = out  # unused
        p_strides, l_strides = (0, 0, 0), (0, 0)
    else:
        partial_out = torch.empty((num_tokens, q_heads, num_splits, d_v), dtype=torch.float32, device=q.device)
        partial_lse = torch.empty((num_tokens, q_heads, num_splits), dtype=torch.float32, device=q.device)
        p_strides, l_strides = partial_out.stride()[:3], partial_lse.stride()[:2]
    block_dqk, block_dv = max(16, _next_pow2(d_qk)), max(16, _next_pow2(d_v))
    mapping = slot_mapping if slot_mapping is not None else req_to_token  # placeholder pointer when unused
    _paged_attention_split_kernel[(batch_size, kv_heads * row_blocks, num_splits)](
        q, k_buffer, v_buffer, out, partial_out, partial_lse,
        req_to_token, req_pool_indices, positions, mapping,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0), out.stride(0), out.stride(1), *p_strides, *l_strides,
        sm_scale * LOG2E, window or 0, num_splits,
        HAS_WINDOW=window is not None, TOKENS_PER_REQ=tokens_per_req, GROUP=group, ROW_BLOCKS=row_blocks,
        D_QK=d_qk, D_V=d_v, BLOCK_DQK=block_dqk, BLOCK_DV=block_dv, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_MAPPING=slot_mapping is not None, DIRECT=direct,
        # fp32 engines (the tests) compare with torch's fp32 attention: keep tensor cores out of it.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PIPELINED_LOOP=not _INTERPRETED, DOT_UPCAST=_INTERPRETED and q.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages,
    )
    if not direct:
        _merge_splits_kernel[(num_tokens, q_heads)](
            out, partial_out, partial_lse,
            out.stride(0), out.stride(1), *p_strides, *l_strides,
            num_splits,
            D_V=d_v, BLOCK_DV=block_dv, BLOCK_S=max(2, _next_pow2(num_splits)),
            num_warps=4 if block_dv >= 128 else 2,
        )
    return out
