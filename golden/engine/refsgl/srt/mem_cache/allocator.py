"""Free-list slot allocators. Slot 0 is padding and never handed out.

Like sglang's, `free` puts slots at the front of the free list, so a freed slot is the
next one allocated (which is what makes a use-after-free bite quickly).
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    def __init__(self, size: int, device: str):
        self.size = size
        self.device = device
        self.reset()

    def reset(self):
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)

    def available_size(self) -> int:
        return len(self.free_pages)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self.free_pages):
            return None
        select_index = self.free_pages[:need_size]
        self.free_pages = self.free_pages[need_size:]
        return select_index

    def free(self, free_index: torch.Tensor):
        if free_index.numel():
            self.free_pages = torch.cat((free_index.to(self.free_pages), self.free_pages))


class SWATokenToKVPoolAllocator:
    """Allocates a full slot and an SWA slot per token and keeps `full_to_swa_index_mapping`.

    A full slot's SWA slot is reference counted by the holders that still need it inside
    their window (its request, later requests sharing it as a prefix, the prefix cache);
    `free_swa` drops one hold and evicts the SWA slot when none is left.
    """

    def __init__(self, kvcache):
        self.kvcache = kvcache
        self.device = kvcache.device
        self.full_attn_allocator = TokenToKVPoolAllocator(kvcache.size, kvcache.device)
        self.swa_attn_allocator = TokenToKVPoolAllocator(kvcache.size_swa, kvcache.device)
        self.full_to_swa_index_mapping = kvcache.full_to_swa_index_mapping
        self.swa_refs = torch.zeros((kvcache.size + 1,), dtype=torch.int32, device=kvcache.device)

    def reset(self):
        self.full_attn_allocator.reset()
        self.swa_attn_allocator.reset()
        self.full_to_swa_index_mapping.zero_()
        self.swa_refs.zero_()

    def available_size(self) -> int:
        return min(self.full_attn_allocator.available_size(), self.swa_attn_allocator.available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        self.full_to_swa_index_mapping[full] = swa
        self.swa_refs[full] = 1
        return full

    def free(self, free_index: torch.Tensor):
        """Free full slots together with whatever SWA slots they still map to."""
        if not free_index.numel():
            return
        swa = self.full_to_swa_index_mapping[free_index]
        self.swa_attn_allocator.free(swa[swa > 0])
        self.full_to_swa_index_mapping[free_index] = 0
        self.swa_refs[free_index] = 0
        self.full_attn_allocator.free(free_index)

    def free_and_release_swa(self, full_index: torch.Tensor, release: torch.Tensor) -> bool:
        """`free` the entries where `release` is False and `free_swa` the others, in one pass.

        Gives what calling `free` / `free_swa` on runs of these entries would give, with the runs
        listed last-called first (the free lists take freed slots at the front). Refuses (returns
        False, changing nothing) when a slot is listed twice: then its holds depend on call order.
        """
        if torch.unique(full_index).numel() != full_index.numel():
            return False
        swa = self.full_to_swa_index_mapping[full_index]
        mapped = swa > 0
        self.swa_refs[full_index[release & mapped]] -= 1
        freed = ~release
        evict = mapped & (freed | (self.swa_refs[full_index] <= 0))
        self.swa_attn_allocator.free(swa[evict])
        cleared = full_index[freed | evict]
        self.full_to_swa_index_mapping[cleared] = 0
        self.swa_refs[cleared] = 0
        self.full_attn_allocator.free(full_index[freed])
        return True

    def acquire_swa(self, full_index: torch.Tensor):
        mapped = full_index[self.full_to_swa_index_mapping[full_index] > 0]
        self.swa_refs[mapped] += 1

    def free_swa(self, full_index: torch.Tensor):
        """Drop one window hold on each slot; evict the SWA slots nobody holds any more."""
        mapped = full_index[self.full_to_swa_index_mapping[full_index] > 0]
        if not mapped.numel():
            return
        self.swa_refs[mapped] -= 1
        evict = mapped[self.swa_refs[mapped] <= 0]
        if evict.numel():
            self.swa_attn_allocator.free(self.full_to_swa_index_mapping[evict])
            self.full_to_swa_index_mapping[evict] = 0
            self.swa_refs[evict] = 0
