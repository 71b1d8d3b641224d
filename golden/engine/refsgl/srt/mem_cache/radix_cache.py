"""Prefix cache: a token trie whose nodes own KV slots, shared by requests with a common prefix.

One node per token keeps it short (sglang compresses runs into radix edges). With EAGLE
the key of position p is the bigram (t_p, t_{p+1}), because the draft KV of position p
was computed from token p + 1; with SWA a match is cut back until its last window of
positions still has SWA slots.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Optional

import torch

_clock = itertools.count()


class TreeNode:
    __slots__ = ("key", "slot", "parent", "children", "lock_ref", "last_access", "swa_held")

    def __init__(self, key, slot: int, parent: Optional["TreeNode"]):
        self.key = key
        self.slot = slot
        self.parent = parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = next(_clock)
        self.swa_held = False


class RadixCache:
    def __init__(self, allocator, *, bigram_keys: bool = False, swa_window: Optional[int] = None, disable: bool = False):
        self.allocator = allocator
        self.bigram_keys = bigram_keys
        self.swa_window = swa_window
        self.disable = disable
        self.reset()

    def reset(self):
        """Forget every node (the caller resets the allocator that owned their slots)."""
        self.root = self._new_node(None, 0, None)
        self.root.lock_ref = 1
        self.num_nodes = 0

    def _keys(self, token_ids: list[int]) -> list:
        if self.bigram_keys:
            return list(zip(token_ids[:-1], token_ids[1:]))
        return list(token_ids)

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], TreeNode]:
        """Longest cached prefix of `token_ids` that leaves at least one token to compute."""
        if self.disable:
            return [], self.root
        path = self._match_path(self._keys(token_ids)[: len(token_ids) - 1])
        if self.swa_window is not None and path:
            path = self._cut_to_mapped_window(path)
        slots = [n.slot for n in path]
        return slots, (path[-1] if path else self.root)

    def _match_path(self, keys: list) -> list:
        """The nodes of the longest cached prefix of `keys`, each marked as just used."""
        node, path = self.root, []
        for key in keys:
            child = node.children.get(key)
            if child is None:
                break
            child.last_access = next(_clock)
            path.append(child)
            node = child
        return path

    def _new_node(self, key, slot: int, parent: TreeNode) -> TreeNode:
        return TreeNode(key, slot, parent)

    def _cut_to_mapped_window(self, path: list[TreeNode]) -> list[TreeNode]:
        mapping = self.allocator.full_to_swa_index_mapping
        mapped = (mapping[torch.tensor([n.slot for n in path], device=mapping.device)] > 0).tolist()
        end = len(path)
        while end > 0 and not all(mapped[max(0, end - self.swa_window) : end]):
            end -= 1
        return path[:end]

    def inc_lock_ref(self, node: TreeNode):
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode):
        while node is not None:
            node.lock_ref -= 1
            node = node.parent

    def insert(self, token_ids: list[int], slots: list[int]) -> list[int]:
        """Cache `slots` (positions 0..n-1 of `token_ids`); returns slots that duplicate cached ones."""
        if self.disable:
            return list(slots)
        keys = self._keys(token_ids)[: len(slots)]
        if len(keys) < len(slots):
            raise ValueError(f"insert: {len(slots)} slots need {len(slots) + int(self.bigram_keys)} token ids")
        node, duplicates, created = self.root, [], []
        for pos, (key, slot) in enumerate(zip(keys, slots)):
            child = node.children.get(key)
            if child is None:
                child = self._new_node(key, slot, node)
                node.children[key] = child
                self.num_nodes += 1
                created.append((pos, child))
            elif child.slot != slot:
                duplicates.append(slot)
            child.last_access = next(_clock)
            node = child
        if self.swa_window is not None:
            self._hold_last_window(created, len(slots))
        return duplicates

    def _hold_last_window(self, created: list, length: int):
        """Keep the SWA slots of the inserted sequence's last window so it can be matched later."""
        tail = [n for pos, n in created if pos >= length - self.swa_window]
        if tail:
            self.allocator.acquire_swa(torch.tensor([n.slot for n in tail], device=self.allocator.device))
            for n in tail:
                n.swa_held = True

    def evictable_size(self) -> int:
        return sum(1 for n in self._nodes() if n.lock_ref == 0)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evict(self, num_tokens: int) -> int:
        """Free up to `num_tokens` slots, least recently used unlocked leaves first."""
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = []
        while leaves and len(freed) < num_tokens:
            _, _, node = heapq.heappop(leaves)
            freed.append(node.slot)
            parent = node.parent
            del parent.children[node.key]
            self.num_nodes -= 1
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        if freed:
            self.allocator.free(torch.tensor(freed, dtype=torch.int64, device=self.allocator.device))
        return len(freed)
