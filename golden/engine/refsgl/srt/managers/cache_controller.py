"""HiCacheController: moves KV between the device pool and the host pool for the hierarchical cache.

sglang's controller queues writes and loads and runs them on transfer streams, the forward waiting for a
load layer by layer; this one runs each transfer at once on the calling stream, with the same calls into
the host pool (`backup_from_device_all_layer`, then `load_to_device_per_layer` for every layer) and the
same allocation rules: a write takes host slots, a load takes device slots from the device allocator.
"""

from __future__ import annotations

from typing import Optional

import torch


class HiCacheController:
    def __init__(self, token_to_kv_pool_allocator, mem_pool_host, io_backend: str = "direct"):
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_host = mem_pool_host
        self.mem_pool_device = mem_pool_host.device_pool
        self.io_backend = io_backend
        self.write_policy = "write_through"
        self.enable_storage = False  # no third (storage) tier
        self.layer_num = mem_pool_host.layer_num

    def write(self, device_indices: torch.Tensor) -> Optional[torch.Tensor]:
        """Back device slots up to newly allocated host slots; None when the host pool is full."""
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.mem_pool_host.backup_from_device_all_layer(self.mem_pool_device, host_indices, device_indices,
                                                        self.io_backend)
        return host_indices

    def load(self, host_indices: torch.Tensor) -> Optional[torch.Tensor]:
        """Load host slots into newly allocated device slots; None when the device allocator is short."""
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        for layer_id in range(self.layer_num):
            self.mem_pool_host.load_to_device_per_layer(self.mem_pool_device, host_indices, device_indices, layer_id,
                                                        self.io_backend)
        return device_indices

    def evict_device(self, device_indices: torch.Tensor) -> int:
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices: torch.Tensor) -> int:
        return self.mem_pool_host.free(host_indices)
