"""Host KV pools for the hierarchical cache (sglang's `HostKVCache`, `MHATokenToKVPoolHost`, `MLATokenToKVPoolHost`).

A host pool holds a copy of device KV in host memory, one row per host slot, in sglang's `layer_first`
layout. `backup_from_device_all_layer` copies device slots to host slots for every layer at once;
`load_to_device_per_layer` copies host slots back into device slots one layer at a time (sglang overlaps
the layers with the forward). Both take the device pool and index lists, and move KV with the `direct`
io backend: plain indexed copies. Unlike device pools, host slots start at 0: no padding row.
"""

from __future__ import annotations

from typing import Optional

import torch


class HostKVCache:
    def __init__(
        self,
        device_pool,
        host_to_device_ratio: float,
        host_size: int = 0,
        page_size: int = 1,
        layout: str = "layer_first",
        pin_memory: bool = False,
        device: str = "cpu",
    ):
        if layout != "layer_first":
            raise ValueError(f"{type(self).__name__}: layout {layout!r} is not supported; use 'layer_first'")
        if page_size != 1:
            raise ValueError(f"{type(self).__name__}: page_size {page_size} is not supported; use 1")
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.dtype = device_pool.dtype
        self.layer_num = device_pool.layer_num
        self.size = host_size if host_size > 0 else int(device_pool.size * host_to_device_ratio)
        if self.size < 1:
            raise ValueError(f"{type(self).__name__}: the host pool needs at least one slot, got {self.size}")
        self.kv_buffer = self.init_kv_buffer()
        self.clear()

    def init_kv_buffer(self) -> torch.Tensor:
        raise NotImplementedError

    def _layers(self, device_pool, layer_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(host rows, device rows) of one layer, per KV half: host rows are `[host slots, ...]`."""
        raise NotImplementedError

    def clear(self):
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > len(self.free_slots):
            return None
        select_index, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select_index

    def free(self, indices: torch.Tensor) -> int:
        self.free_slots = torch.cat([self.free_slots, indices.cpu().to(torch.int64)])
        return len(indices)

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        """Copy device slots `device_indices` of every layer into host slots `host_indices`."""
        host, dev = host_indices.cpu().long(), device_indices.long()
        for layer_id in range(self.layer_num):
            for host_rows, device_rows in self._layers(device_pool, layer_id):
                host_rows[host] = device_rows[dev.to(device_rows.device)].to(host_rows.device)

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend):
        """Copy host slots `host_indices` of layer `layer_id` into device slots `device_indices`."""
        host, dev = host_indices.cpu().long(), device_indices.long()
        for host_rows, device_rows in self._layers(device_pool, layer_id):
            device_rows[dev.to(device_rows.device)] = host_rows[host].to(device_rows.device)


class MHATokenToKVPoolHost(HostKVCache):
    """K and V per layer: `kv_buffer[2, layers, host slots, heads, head_dim]`."""

    def init_kv_buffer(self) -> torch.Tensor:
        pool = self.device_pool
        shape = (2, self.layer_num, self.size, pool.head_num, pool.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device, pin_memory=self.pin_memory)

    @property
    def k_buffer(self) -> torch.Tensor:
        return self.kv_buffer[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        return self.kv_buffer[1]

    def _layers(self, device_pool, layer_id: int):
        return [(self.k_buffer[layer_id], device_pool.k_buffer[layer_id]),
                (self.v_buffer[layer_id], device_pool.v_buffer[layer_id])]


class MLATokenToKVPoolHost(HostKVCache):
    """One latent row per layer: `kv_buffer[layers, host slots, 1, kv_lora_rank + qk_rope_head_dim]`."""

    def init_kv_buffer(self) -> torch.Tensor:
        pool = self.device_pool
        shape = (self.layer_num, self.size, 1, pool.kv_lora_rank + pool.qk_rope_head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device, pin_memory=self.pin_memory)

    def _layers(self, device_pool, layer_id: int):
        return [(self.kv_buffer[layer_id], device_pool.kv_buffer[layer_id])]
