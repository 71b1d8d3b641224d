"""Prefix trees in the shapes the sweep's walker must read, for tests (sglang itself is not importable here).

``CompressedRadixCache`` follows sglang's ``RadixCache`` (srt/mem_cache/radix_cache.py, page size 1):
``root_node``, nodes with ``children`` keyed by their first token, a ``key`` run of tokens, a
``value`` tensor of KV slots on the pool's device, ``lock_ref`` counts propagated to the root,
node splits on a partial match (the upper half becomes a new parent; the original node object
keeps the lower half), leaf-first eviction, HiCache-style device eviction (``value = None``),
and ``reset`` replacing the root. ``FlatWalkCache`` is a cache whose tree core answers
``walk_for_kv_canary`` itself, as sglang's unified and Rust tree cores do.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch


class TreeNode:
    def __init__(self):
        self.children = defaultdict(TreeNode)
        self.parent = None
        self.key: list[int] = []
        self.value = None
        self.lock_ref = 0


class CompressedRadixCache:
    def __init__(self, device="cpu"):
        self.device = device
        self.reset()

    def reset(self):
        self.root_node = TreeNode()
        self.root_node.value = []
        self.root_node.lock_ref = 1

    def insert(self, tokens: list[int], slots: list[int]) -> list[int]:
        """Cache ``slots`` for ``tokens``; returns the slots that duplicate cached ones (the caller frees them)."""
        value = torch.tensor(slots, dtype=torch.int64, device=self.device)
        node, i, duplicates = self.root_node, 0, []
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = TreeNode()
                new.parent, new.key, new.value = node, list(tokens[i:]), value[i:].clone()
                node.children[tokens[i]] = new
                return duplicates
            n = _common(child.key, tokens[i:])
            if n < len(child.key):
                child = self._split(child, n)
            if child.value is None:  # HiCache load-back: the node gets device KV again
                child.value = value[i : i + n].clone()
            else:
                duplicates += value[i : i + n].tolist()
            node, i = child, i + n
        return duplicates

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        new = TreeNode()
        new.children = defaultdict(TreeNode, {child.key[n]: child})
        new.parent, new.lock_ref = child.parent, child.lock_ref
        new.key, new.value = child.key[:n], None if child.value is None else child.value[:n].clone()
        child.parent = new
        child.key, child.value = child.key[n:], None if child.value is None else child.value[n:].clone()
        new.parent.children[new.key[0]] = new
        return new

    def match_prefix(self, tokens: list[int]) -> TreeNode:
        node, i = self.root_node, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None or child.value is None:
                break
            n = _common(child.key, tokens[i:])
            if n < len(child.key):
                child = self._split(child, n)
            node, i = child, i + n
        return node

    def inc_lock_ref(self, node: TreeNode):
        while node is not self.root_node:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode):
        while node is not self.root_node:
            node.lock_ref -= 1
            node = node.parent

    def nodes(self):
        return descendants(self.root_node)

    def evict_leaf(self, node: TreeNode) -> list[int]:
        if node.children or node.lock_ref:
            raise ValueError("only unlocked leaves are evicted")
        del node.parent.children[node.key[0]]
        return [] if node.value is None else node.value.tolist()

    def evict_device(self, node: TreeNode) -> list[int]:
        """HiCache: the device KV goes (the host keeps a copy); the node stays in the tree."""
        if any(c.value is not None for c in node.children.values()) or node.lock_ref:
            raise ValueError("device KV is evicted leaf-first and unlocked")
        freed, node.value = node.value.tolist(), None
        return freed

    def truth(self, unlocked_only=True) -> dict[int, tuple[int, int]]:
        """slot -> (position, predecessor slot or -1) for every slot the tree holds (unlocked ones by default)."""
        out = {}
        stack = [(c, 0, -1) for c in self.root_node.children.values()]
        while stack:
            node, depth, prev = stack.pop()
            slots = node.value.tolist() if node.value is not None else None
            if slots is not None and (node.lock_ref == 0 or not unlocked_only):
                for j, s in enumerate(slots):
                    out[s] = (depth + j, slots[j - 1] if j else prev)
            last = slots[-1] if slots else -1
            stack.extend((c, depth + len(node.key), last) for c in node.children.values())
        return out


def descendants(root):
    """Every node under ``root`` (not ``root`` itself), depth first."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class WalkResult:
    slot_indices: torch.Tensor
    positions: torch.Tensor
    prev_slot_indices: torch.Tensor


class _FlatCore:
    def __init__(self, tree: CompressedRadixCache):
        self.tree = tree
        self.calls = 0

    def walk_for_kv_canary(self, unlocked_only: bool, swa_resident_only: bool) -> WalkResult:
        self.calls += 1
        rows = sorted((p, s, prev) for s, (p, prev) in self.tree.truth(unlocked_only).items())
        cols = list(zip(*rows)) if rows else [(), (), ()]
        return WalkResult(*(torch.tensor(c, dtype=torch.int64) for c in (cols[1], cols[0], cols[2])))


class FlatWalkCache:
    """A cache whose tree core walks itself (no ``root_node`` on the cache object)."""

    def __init__(self, tree: CompressedRadixCache):
        self.tree_core = _FlatCore(tree)


class ComponentData:
    def __init__(self):
        self.value = None
        self.lock_ref = 0


class UnifiedNode:
    """sglang's ``UnifiedTreeNode`` (srt/mem_cache/unified_cache/unified_tree_core.py, 0.5.17) as the canary reads
    it: no ``value`` or ``lock_ref`` of its own, each component's in ``component_data`` (FULL = 0, SWA = 1)."""

    def __init__(self):
        self.children: dict = {}
        self.parent = None
        self.key: list[int] = []
        self.component_data = [ComponentData(), ComponentData(), ComponentData()]


class UnifiedCore:
    """The tree core: ``root_node``, page-size-1 inserts that split a node on a partial match the way
    ``_split_node`` does (a new upper node takes the front of each component's value as a clone; the original
    node object keeps the rest, also cloned), leaf eviction that clears the value and detaches the node, SWA
    eviction that frees a node's SWA value alone, locks per component, and its own ``walk_for_kv_canary``."""

    def __init__(self, device="cpu"):
        self.device = device
        self.reset()

    def reset(self):
        self.root_node = UnifiedNode()
        self.root_node.component_data[0].value = []
        for data in self.root_node.component_data:
            data.lock_ref = 1

    def insert(self, tokens: list[int], slots: list[int], swa_slots: list[int] | None = None) -> None:
        value = torch.tensor(slots, dtype=torch.int64, device=self.device)
        swa = None if swa_slots is None else torch.tensor(swa_slots, dtype=torch.int64, device=self.device)
        node, i = self.root_node, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = UnifiedNode()
                new.parent, new.key = node, list(tokens[i:])
                new.component_data[0].value = value[i:].clone()
                new.component_data[1].value = None if swa is None else swa[i:].clone()
                node.children[tokens[i]] = new
                return
            n = _common(child.key, tokens[i:])
            if n < len(child.key):
                child = self.split(child, n)
            node, i = child, i + n

    def split(self, child: UnifiedNode, n: int) -> UnifiedNode:
        new = UnifiedNode()
        new.children = {child.key[n]: child}
        new.parent, new.key = child.parent, child.key[:n]
        for ct in (0, 1):
            data, upper = child.component_data[ct], new.component_data[ct]
            upper.lock_ref = data.lock_ref
            if data.value is not None:
                upper.value, data.value = data.value[:n].clone(), data.value[n:].clone()
        child.parent, child.key = new, child.key[n:]
        new.parent.children[new.key[0]] = new
        return new

    def nodes(self):
        return descendants(self.root_node)

    def lock(self, node: UnifiedNode, delta: int = 1) -> None:
        while node is not self.root_node:
            node.component_data[0].lock_ref += delta
            node = node.parent

    def evict_leaf(self, node: UnifiedNode) -> None:
        assert not node.children and node.component_data[0].lock_ref == 0
        node.component_data[0].value = node.component_data[1].value = None
        del node.parent.children[node.key[0]]

    def free_swa(self, node: UnifiedNode) -> None:
        node.component_data[1].value = None  # a tombstone: the full slots stay

    def walk_for_kv_canary(self, unlocked_only: bool, swa_resident_only: bool) -> WalkResult:
        rows = []

        def dfs(node, depth, parent_last):
            value = node.component_data[0].value
            slots = value.tolist() if isinstance(value, torch.Tensor) else []
            emit = node is not self.root_node and (not unlocked_only or node.component_data[0].lock_ref == 0)
            last = parent_last
            for j, slot in enumerate(slots):
                if emit:
                    rows.append((slot, depth + j, parent_last if j == 0 else slots[j - 1]))
                last = slot
            for child in node.children.values():
                dfs(child, depth + len(node.key), last)

        dfs(self.root_node, 0, -1)
        cols = list(zip(*rows)) if rows else [(), (), ()]
        return WalkResult(*(torch.tensor(c, dtype=torch.int64) for c in cols))


class UnifiedCache:
    """sglang 0.5.17's ``UnifiedRadixCache`` (the hybrid SWA models' cache): ``root_node`` is its core's, and the
    core walks itself."""

    def __init__(self, device="cpu"):
        self.tree_core = UnifiedCore(device)

    @property
    def root_node(self):
        return self.tree_core.root_node
