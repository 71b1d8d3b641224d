"""Hierarchical prefix cache (sglang's HiRadixCache, write-through): cached KV also lives in a host pool.

Every node the cache takes in is backed up to the host pool at once (write-through), so evicting it from
the device only frees its device slot: the node stays in the trie with its host slot. A later match that
reaches such nodes loads them back into whatever device slots the allocator hands out (evicting others if
it must) before the request reads them. Eviction runs leaf-first over the device copies, so the nodes of a
path that live on the host only always form its tail. When the host pool is full, host-only leaves go
first; a node that could not be backed up is dropped from the trie when evicted, as in the plain cache.

Nodes are sglang's shape: `value` holds the device slot (None once evicted to the host), `host_value` the
host slot (None until backed up).
"""

from __future__ import annotations

import heapq
from typing import Optional

import torch

from refsgl.srt.managers.cache_controller import HiCacheController
from refsgl.srt.mem_cache.memory_pool import MLATokenToKVPool
from refsgl.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from refsgl.srt.mem_cache.radix_cache import RadixCache, _clock


class HiTreeNode:
    __slots__ = ("key", "value", "host_value", "parent", "children", "lock_ref", "last_access")

    def __init__(self, key, slot: Optional[int], parent: Optional["HiTreeNode"]):
        self.key = key  # the tokens the node covers (one), as sglang's radix key; its parent's children map the token
        self.value: Optional[list[int]] = None if slot is None else [slot]
        self.host_value: Optional[list[int]] = None
        self.parent = parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = next(_clock)

    @property
    def slot(self) -> Optional[int]:
        return None if self.value is None else self.value[0]

    @property
    def evicted(self) -> bool:
        return self.value is None


class HiRadixCache(RadixCache):
    def __init__(self, allocator, token_to_kv_pool, hicache_ratio: float, *, disable: bool = False):
        host_class = MLATokenToKVPoolHost if isinstance(token_to_kv_pool, MLATokenToKVPool) else MHATokenToKVPoolHost
        self.token_to_kv_pool_host = host_class(
            token_to_kv_pool, hicache_ratio, pin_memory=torch.device(token_to_kv_pool.device).type == "cuda"
        )
        self.cache_controller = HiCacheController(allocator, self.token_to_kv_pool_host)
        self.backed_up_tokens = 0
        self.loaded_back_tokens = 0
        super().__init__(allocator, disable=disable)

    def reset(self):
        super().reset()
        self.token_to_kv_pool_host.clear()

    # ------------------------------------------------------------------ matching and loading back

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], HiTreeNode]:
        """Longest cached prefix, its host-only tail loaded back to the device (or cut off when that fails)."""
        if self.disable:
            return [], self.root
        path = self._match_path(self._keys(token_ids)[: len(token_ids) - 1])
        on_device = next((i for i, n in enumerate(path) if n.evicted), len(path))
        if on_device < len(path) and not self._load_back(path[on_device:], path[on_device - 1] if on_device else self.root):
            path = path[:on_device]
        return [n.slot for n in path], (path[-1] if path else self.root)

    def _load_back(self, nodes: list[HiTreeNode], anchor: HiTreeNode) -> bool:
        self.inc_lock_ref(anchor)  # the device part of the path stays while slots are made for the rest
        host_indices = torch.tensor([n.host_value[0] for n in nodes], dtype=torch.int64)
        device_indices = self.cache_controller.load(host_indices)
        if device_indices is None:
            self.evict(len(nodes) - self.allocator.available_size())
            device_indices = self.cache_controller.load(host_indices)
        self.dec_lock_ref(anchor)
        if device_indices is None:
            return False
        for node, slot in zip(nodes, device_indices.tolist()):
            node.value = [slot]
        self.loaded_back_tokens += len(nodes)
        return True

    # ------------------------------------------------------------------ inserting and backing up

    def _new_node(self, key, slot: int, parent: HiTreeNode) -> HiTreeNode:
        return HiTreeNode((key,), slot, parent)

    def insert(self, token_ids: list[int], slots: list[int]) -> list[int]:
        if self.disable:
            return list(slots)
        keys = self._keys(token_ids)[: len(slots)]
        for node, slot in zip(self._match_path(keys), slots):
            if node.evicted:
                node.value = [slot]  # on the host only: the request's slot holds this position's KV again
        duplicates = super().insert(token_ids, slots)
        self._write_through(self._match_path(keys))
        return duplicates

    def _write_through(self, path: list[HiTreeNode]):
        """Back up the nodes of `path` that have no host copy yet, in one transfer (all or none)."""
        pending = [n for n in path if n.host_value is None]
        if not pending:
            return
        device_indices = torch.tensor([n.slot for n in pending], dtype=torch.int64, device=self.allocator.device)
        host_indices = self.cache_controller.write(device_indices)
        if host_indices is None:
            self.evict_host(len(pending) - self.token_to_kv_pool_host.available_size())
            host_indices = self.cache_controller.write(device_indices)
        if host_indices is None:
            return  # kept on the device only; dropped from the trie when evicted
        for node, host_slot in zip(pending, host_indices.tolist()):
            node.host_value = [host_slot]
        self.backed_up_tokens += len(pending)

    # ------------------------------------------------------------------ eviction

    def evictable_size(self) -> int:
        return sum(1 for n in self._nodes() if not n.evicted and n.lock_ref == 0)

    @staticmethod
    def _is_device_leaf(node: HiTreeNode) -> bool:
        return not node.evicted and all(c.evicted for c in node.children.values())

    def evict(self, num_tokens: int) -> int:
        """Free up to `num_tokens` device slots, least recently used device leaves first; backed-up nodes
        stay in the trie on the host."""
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if self._is_device_leaf(n) and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = []
        while leaves and len(freed) < num_tokens:
            _, _, node = heapq.heappop(leaves)
            freed.append(node.slot)
            node.value = None
            parent = node.parent
            if node.host_value is None:  # never backed up, so it has no children (their copies need its own)
                del parent.children[node.key[0]]
                self.num_nodes -= 1
            if parent is not self.root and parent.lock_ref == 0 and self._is_device_leaf(parent):
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        if freed:
            self.cache_controller.evict_device(torch.tensor(freed, dtype=torch.int64, device=self.allocator.device))
        return len(freed)

    def evict_host(self, num_tokens: int) -> int:
        """Drop up to `num_tokens` host-only leaves from the trie, least recently used first."""
        leaves = [(n.last_access, id(n), n) for n in self._nodes()
                  if n.evicted and not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = []
        while leaves and len(freed) < num_tokens:
            _, _, node = heapq.heappop(leaves)
            freed.append(node.host_value[0])
            parent = node.parent
            del parent.children[node.key[0]]
            self.num_nodes -= 1
            if parent is not self.root and parent.evicted and not parent.children:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        if freed:
            self.cache_controller.evict_host(torch.tensor(freed, dtype=torch.int64))
        return len(freed)
