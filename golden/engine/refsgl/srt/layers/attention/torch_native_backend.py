"""Attention over the paged KV cache in plain torch: every key/value is read through `req_to_token`.

Two shapes: a dense path for batches where each request adds the same number of tokens
(decode, draft steps, verify, draft-extend after verify), which has static shapes and is
what CUDA graphs capture; and a per-request loop for ragged prefill chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class ForwardMetadata:
    tokens_per_req: Optional[int]  # dense path when set
    kv_len: int = 0  # dense path: key columns read per request (the whole row in a CUDA graph)
    extend_prefix_lens: Optional[list[int]] = None  # ragged path
    extend_seq_lens: Optional[list[int]] = None


class TorchNativeAttnBackend:
    def __init__(self, model_runner):
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.max_context_len = model_runner.req_to_token_pool.max_context_len
        self.forward_metadata: Optional[ForwardMetadata] = None

    def init_forward_metadata(self, forward_batch, tokens_per_req: Optional[int] = None):
        if tokens_per_req is None:
            tokens_per_req = 1 if forward_batch.forward_mode.is_decode() else forward_batch.num_tokens_per_req
        if tokens_per_req is not None:
            # Eager: read only up to the furthest position (one host read per forward, not per layer).
            kv_len = int(forward_batch.positions.max()) + 1 if forward_batch.positions.numel() else 1
            self.forward_metadata = ForwardMetadata(tokens_per_req=tokens_per_req, kv_len=kv_len)
        else:
            self.forward_metadata = ForwardMetadata(
                tokens_per_req=None,
                extend_prefix_lens=forward_batch.extend_prefix_lens_cpu,
                extend_seq_lens=forward_batch.extend_seq_lens_cpu,
            )

    def init_forward_metadata_capture_cuda_graph(self, forward_batch, tokens_per_req: int):
        self.forward_metadata = ForwardMetadata(tokens_per_req=tokens_per_req, kv_len=self.max_context_len)

    def forward(self, q: torch.Tensor, layer, forward_batch) -> torch.Tensor:
        """q: [num_tokens, heads, qk_dim] -> [num_tokens, heads, v_dim]; the layer already wrote its KV."""
        meta = self.forward_metadata
        if meta is None:
            raise RuntimeError("attention metadata missing: call init_forward_metadata before the model forward")
        if meta.tokens_per_req is not None:
            return self._forward_dense(q, layer, forward_batch, meta.tokens_per_req, meta.kv_len)
        return self._forward_ragged(q, layer, forward_batch, meta)

    def _forward_dense(self, q, layer, forward_batch, tokens_per_req: int, kv_len: int):
        bs = forward_batch.req_pool_indices.shape[0]
        slots = self.req_to_token[forward_batch.req_pool_indices, :kv_len].long()  # [bs, kv_len]
        k, v = layer.load_kv(forward_batch.token_to_kv_pool, slots)
        q_pos = forward_batch.positions.view(bs, tokens_per_req)
        kv_pos = torch.arange(kv_len, device=q.device)
        mask = self._mask(q_pos, kv_pos, layer.sliding_window)  # [bs, T, L]
        out = self._sdpa(q.view(bs, tokens_per_req, *q.shape[1:]), k, v, mask)
        return out.reshape(q.shape[0], *out.shape[2:])

    def _forward_ragged(self, q, layer, forward_batch, meta: ForwardMetadata):
        outputs, start = [], 0
        for i, (prefix_len, extend_len) in enumerate(zip(meta.extend_prefix_lens, meta.extend_seq_lens)):
            kv_len = prefix_len + extend_len
            slots = self.req_to_token[forward_batch.req_pool_indices[i], :kv_len].long()
            k, v = layer.load_kv(forward_batch.token_to_kv_pool, slots)
            q_pos = forward_batch.positions[start : start + extend_len]
            kv_pos = torch.arange(kv_len, device=q.device)
            mask = self._mask(q_pos[None], kv_pos, layer.sliding_window)
            out = self._sdpa(q[None, start : start + extend_len], k[None], v[None], mask)
            outputs.append(out[0])
            start += extend_len
        return torch.cat(outputs, dim=0)

    @staticmethod
    def _mask(q_pos: torch.Tensor, kv_pos: torch.Tensor, sliding_window: Optional[int]) -> torch.Tensor:
        mask = kv_pos[None, None, :] <= q_pos[:, :, None]
        if sliding_window is not None:
            mask &= kv_pos[None, None, :] > q_pos[:, :, None] - sliding_window
        return mask

    @staticmethod
    def _sdpa(q, k, v, mask):
        """q [B, T, Hq, D], k [B, L, Hkv, D], v [B, L, Hkv, Dv], mask [B, T, L] -> [B, T, Hq, Dv]."""
        groups = q.shape[2] // k.shape[2]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=2)
            v = v.repeat_interleave(groups, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None]
        )
        return out.transpose(1, 2)
