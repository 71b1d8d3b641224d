"""Attention over the paged KV cache with Triton kernels on the dense path, torch for ragged prefill.

Same contract and mask as `TorchNativeAttnBackend` (its dense path is the reference): batches
where every request adds the same number of tokens (decode, draft steps, verify, draft-extend
after verify) run `triton_paged_attention.paged_attention`, which reads only the keys each
request can see and takes every length from device memory, so the eager path needs no host read
and a captured CUDA graph follows each replay's batch. Ragged prefill chunks stay on the torch
backend. Latent (MLA) layers attend in the latent space (the cache row is the key, its latent
part the value) with the up-projection folded into the query and the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from refsgl.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from refsgl.srt.layers.attention.triton_paged_attention import choose_num_splits, paged_attention, row_blocking


@dataclass
class ForwardMetadata:
    tokens_per_req: Optional[int]  # dense path when set, else the torch backend's ragged path
    num_splits: int = 1  # key-range splits per request (fixed for a captured graph)


class TritonAttnBackend:
    def __init__(self, model_runner):
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.max_context_len = model_runner.req_to_token_pool.max_context_len
        self.device = model_runner.device
        cfg = model_runner.model_config
        self.latent = cfg.attention_layout == "mla"
        # Query rows per KV head and KV heads, as the kernel's grid sees them.
        self.kv_heads = 1 if self.latent else cfg.num_key_value_heads
        self.group = cfg.num_attention_heads // self.kv_heads
        self.ragged_backend = TorchNativeAttnBackend(model_runner)
        self.forward_metadata: Optional[ForwardMetadata] = None

    def init_forward_metadata(self, forward_batch, tokens_per_req: Optional[int] = None):
        if tokens_per_req is None:
            tokens_per_req = 1 if forward_batch.forward_mode.is_decode() else forward_batch.num_tokens_per_req
        if tokens_per_req is None:
            self.ragged_backend.init_forward_metadata(forward_batch)
            self.forward_metadata = ForwardMetadata(tokens_per_req=None)
        else:
            self.forward_metadata = self._dense_metadata(forward_batch, tokens_per_req)

    def init_forward_metadata_capture_cuda_graph(self, forward_batch, tokens_per_req: int):
        self.forward_metadata = self._dense_metadata(forward_batch, tokens_per_req)

    def _dense_metadata(self, forward_batch, tokens_per_req: int) -> ForwardMetadata:
        # Host shapes only: the split count depends on the batch size, never on its lengths.
        _, row_blocks = row_blocking(tokens_per_req, self.group)
        num_splits = choose_num_splits(
            forward_batch.batch_size, self.kv_heads, row_blocks, self.max_context_len, self.device
        )
        return ForwardMetadata(tokens_per_req=tokens_per_req, num_splits=num_splits)

    def forward(self, q: torch.Tensor, layer, forward_batch) -> torch.Tensor:
        """q: [num_tokens, heads, qk_dim] -> [num_tokens, heads, v_dim]; the layer already wrote its KV."""
        meta = self.forward_metadata
        if meta is None:
            raise RuntimeError("attention metadata missing: call init_forward_metadata before the model forward")
        if meta.tokens_per_req is None:
            return self.ragged_backend.forward(q, layer, forward_batch)
        if self.latent:
            return self._forward_latent(q, layer, forward_batch, meta)
        pool = forward_batch.token_to_kv_pool
        k_buffer, v_buffer = pool.get_kv_buffer(layer.layer_id)
        mapping = pool.full_to_swa_index_mapping if layer.sliding_window is not None else None
        return self._attend(q, k_buffer, v_buffer, forward_batch, meta, q.shape[-1] ** -0.5,
                            window=layer.sliding_window, slot_mapping=mapping)

    def _forward_latent(self, q, layer, forward_batch, meta: ForwardMetadata) -> torch.Tensor:
        """MLA: score against the cached (latent, rope key) row and average latents, then up-project.

        The torch backend expands every cached latent into per-head keys and values through
        kv_b_proj; folding kv_b_proj's key half into the query and its value half into the output
        is the same product regrouped, reading one cache row per key instead of heads x rows.
        """
        heads, nope, v_dim, rank = layer.num_heads, layer.nope_dim, layer.v_dim, layer.kv_lora_rank
        w = layer.kv_b_proj.weight.view(heads, nope + v_dim, rank)
        w_key, w_value = w[:, :nope, :], w[:, nope:, :]
        q_latent = torch.einsum("thn,hnr->thr", q[..., :nope], w_key)
        q_absorbed = torch.cat((q_latent, q[..., nope:]), dim=-1).contiguous()
        cache = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)  # [slots, 1, rank + rope]
        # The score scale is the torch backend's: 1 / sqrt of the per-head query width.
        out_latent = self._attend(q_absorbed, cache, cache[..., :rank], forward_batch, meta, q.shape[-1] ** -0.5)
        return torch.einsum("thr,hvr->thv", out_latent, w_value)

    def _attend(self, q, k_buffer, v_buffer, forward_batch, meta: ForwardMetadata, sm_scale: float,
                window: Optional[int] = None, slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        return paged_attention(
            q, k_buffer, v_buffer, self.req_to_token, forward_batch.req_pool_indices, forward_batch.positions,
            tokens_per_req=meta.tokens_per_req, sm_scale=sm_scale, num_splits=meta.num_splits,
            window=window, slot_mapping=slot_mapping,
        )
