"""KV memory pools: the request -> slot table and the per-layout token -> KV pools (sglang names).

Every token-to-KV pool has `size + 1` rows: row (slot) 0 is padding that CUDA-graph
padding and masked lanes write to, and no request ever owns it.
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """`req_to_token[r, p]` is the KV slot holding position p of the request in row r.

    `size` rows serve requests; row 0 is an extra padding row that is never handed out, so
    CUDA-graph padding (req_pool_index 0) reads and writes it harmlessly, as in sglang.
    """

    def __init__(self, size: int, max_context_len: int, device: str):
        self.size = size
        self._alloc_size = size + 1
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((self._alloc_size, max_context_len), dtype=torch.int32, device=device)
        self.reset()

    def reset(self):
        self.free_slots = list(range(1, self._alloc_size))

    def write(self, indices, values):
        self.req_to_token[indices] = values

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int = 1) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, free_index: int):
        self.free_slots.append(free_index)


class MHATokenToKVPool:
    """Per layer K and V rows `[size + 1, head_num, head_dim]`."""

    def __init__(self, size: int, head_num: int, head_dim: int, layer_num: int, dtype: torch.dtype, device: str):
        self.size = size
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        self.dtype = dtype
        self.device = device
        shape = (size + 1, head_num, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int):
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor):
        self.k_buffer[layer_id][loc] = cache_k.to(self.dtype)
        self.v_buffer[layer_id][loc] = cache_v.to(self.dtype)


class MLATokenToKVPool:
    """Per layer one latent row `[size + 1, 1, kv_lora_rank + qk_rope_head_dim]`: K only, V is derived."""

    def __init__(
        self, size: int, kv_lora_rank: int, qk_rope_head_dim: int, layer_num: int, dtype: torch.dtype, device: str
    ):
        self.size = size
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.layer_num = layer_num
        self.dtype = dtype
        self.device = device
        shape = (size + 1, 1, kv_lora_rank + qk_rope_head_dim)
        self.kv_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layer_num)]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id][..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v=None):
        self.kv_buffer[layer_id][loc] = cache_k.to(self.dtype)


class SWAKVPool:
    """Hybrid sliding-window pool: full-attention layers index `full_kv_pool` by full slot,
    sliding-window layers index `swa_kv_pool` by `full_to_swa_index_mapping[full slot]`
    (0 = the position left the window and its SWA slot was evicted)."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        swa_attention_layer_ids: list[int],
        full_attention_layer_ids: list[int],
        head_num: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str,
    ):
        self.size = size
        self.size_swa = size_swa
        self.dtype = dtype
        self.device = device
        self.full_kv_pool = MHATokenToKVPool(size, head_num, head_dim, len(full_attention_layer_ids), dtype, device)
        self.swa_kv_pool = MHATokenToKVPool(size_swa, head_num, head_dim, len(swa_attention_layer_ids), dtype, device)
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local_id, layer_id in enumerate(full_attention_layer_ids):
            self.layers_mapping[layer_id] = (local_id, False)
        for local_id, layer_id in enumerate(swa_attention_layer_ids):
            self.layers_mapping[layer_id] = (local_id, True)
        self.full_to_swa_index_mapping = torch.zeros((size + 1,), dtype=torch.int64, device=device)

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.layers_mapping[layer_id][1]

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa_index_mapping[kv_indices.long()]

    def _pool(self, layer_id: int):
        local_id, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local_id

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local_id = self._pool(layer_id)
        return pool.get_key_buffer(local_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local_id = self._pool(layer_id)
        return pool.get_value_buffer(local_id)

    def get_kv_buffer(self, layer_id: int):
        pool, local_id = self._pool(layer_id)
        return pool.get_kv_buffer(local_id)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor):
        pool, local_id = self._pool(layer_id)
        if self.is_swa_layer(layer_id):
            loc = self.translate_loc_from_full_to_swa(loc)
        pool.set_kv_buffer(local_id, loc, cache_k, cache_v)
