"""Walk a prefix (radix) cache into sweep rows of slots it holds while no running request locks them.

The tree is read structurally, never by class name: a root (``root_node`` or ``root``), nodes
with a ``children`` mapping, their KV slots in ``value`` (a tensor or list, ``None`` once the
device KV was evicted) or ``slot`` (one int per node), and a lock count (``full_lock_ref`` on
SWA/hybrid trees, else ``lock_ref``). A cache that offers ``walk_for_kv_canary`` (itself or its
``tree_core``: sglang's unified and Rust tree cores) is asked for its flat rows instead. A cache
with no tree (a chunk cache, a disabled cache) has nothing to sweep.

The walk is a depth-first cursor that resumes where the last slice stopped, so each sweep step
does bounded host work. The tree changes between slices; the cursor stays correct because a
frame is re-validated when it is resumed (its parent must still hold it under the same key:
an evicted leaf or a node split since then fails that test and is skipped for this pass), the
predecessor slot is read from the parent at that moment, and a replaced root (cache flushed)
restarts the pass. Node values are never read on the host: sglang keeps them on the device, so
a slice hands device slices over and the sweep gathers them on the device, with no sync.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

UNKNOWN_PREV = -1  # no known predecessor slot: position 0, or the predecessor's device KV was evicted

SlotValues = Union[Sequence[int], Any]  # host ints, or a 1-D tensor (host or device)


@dataclass
class Segment:
    """Consecutive positions of one cached path: slot j sits at ``start_position + j``; the row of
    slot 0 has predecessor ``prev`` (an int, ``UNKNOWN_PREV``, or a one-element tensor), the others
    the slot before them."""

    slots: SlotValues
    start_position: int
    prev: Any = UNKNOWN_PREV

    def __len__(self) -> int:
        return len(self.slots)


@dataclass
class FlatRows:
    """Rows as given by a cache's own ``walk_for_kv_canary``: three aligned 1-D tensors."""

    slots: Any
    positions: Any
    prevs: Any

    def __len__(self) -> int:
        return int(self.slots.shape[0])


@dataclass
class WalkSlice:
    segments: list = field(default_factory=list)  # Segment and FlatRows, in walk order
    pass_done: bool = False  # this slice finished a full pass over the tree

    @property
    def rows(self) -> int:
        return sum(len(s) for s in self.segments)


# sglang's unified tree (``UnifiedTreeNode``, the cache of hybrid SWA models from 0.5.17): a node keeps each
# component's data in ``component_data``, a list indexed by component type (FULL = 0, SWA = 1), each with its own
# ``value`` (device slots, or None once freed) and ``lock_ref``.
COMPONENTS = "component_data"
_FULL, _SWA = 0, 1


@dataclass(frozen=True)
class NodeShape:
    """How this cache's nodes spell children, slots and locks (read once from the root)."""

    slots_attr: str  # "value" (tensor/list/None), "slot" (one int) or COMPONENTS (the FULL component's value)
    lock_attr: str  # "full_lock_ref", "lock_ref" or COMPONENTS (the FULL component's lock_ref)

    def holding(self, node: Any) -> Any:
        """What the node holds its slots in, as it is: a tensor or list (None once freed), or one int."""
        if self.slots_attr == COMPONENTS:
            return node.component_data[_FULL].value
        return getattr(node, self.slots_attr)

    def slots(self, node: Any) -> Optional[SlotValues]:
        if self.slots_attr == "slot":
            return (node.slot,)
        return self.holding(node)

    def swa_freed(self, node: Any) -> bool:
        """The node's SWA slots are freed while its full ones stay (an SWA tree's tombstone; in the unified tree,
        its SWA component's value is None)."""
        if self.slots_attr == COMPONENTS:
            data = node.component_data
            return len(data) > _SWA and data[_SWA].value is None
        return bool(getattr(node, "swa_tombstone", False))

    def span(self, node: Any, slots: Optional[SlotValues]) -> int:
        """Positions the node covers: its slots, or its key's length once its device KV is evicted."""
        if slots is not None:
            return len(slots)
        key = getattr(node, "key", None)
        return len(key) if key is not None else 0

    def locked(self, node: Any) -> bool:
        if self.lock_attr == COMPONENTS:
            return node.component_data[_FULL].lock_ref > 0
        return getattr(node, self.lock_attr) > 0


def tree_root(cache: Any) -> Any:
    root = getattr(cache, "root_node", None)
    return root if root is not None else getattr(cache, "root", None)


def flat_walker(cache: Any):
    """The cache's own ``walk_for_kv_canary`` (on the cache or its ``tree_core``), or None."""
    for owner in (cache, getattr(cache, "tree_core", None)):
        walk = getattr(owner, "walk_for_kv_canary", None) if owner is not None else None
        if callable(walk):
            return walk
    return None


def node_shape(cache: Any) -> Optional[NodeShape]:
    """The node shape of ``cache``'s tree; None when it has no tree; ValueError when it cannot be read."""
    root = tree_root(cache)
    if root is None:
        return None
    where = f"{type(cache).__qualname__} (root {type(root).__qualname__})"
    children = getattr(root, "children", None)
    if not (hasattr(children, "get") and hasattr(children, "items")):
        raise ValueError(f"kv canary sweep: cannot walk {where}: its nodes have no 'children' mapping")
    if _component_node(root):
        return NodeShape(COMPONENTS, COMPONENTS)
    slots_attr = "value" if hasattr(root, "value") else "slot" if hasattr(root, "slot") else None
    lock_attr = "full_lock_ref" if hasattr(root, "full_lock_ref") else "lock_ref" if hasattr(root, "lock_ref") else None
    if slots_attr is None:
        raise ValueError(f"kv canary sweep: cannot walk {where}: its nodes hold slots in neither 'value' nor 'slot'")
    if lock_attr is None:
        raise ValueError(
            f"kv canary sweep: cannot walk {where}: its nodes have neither 'full_lock_ref' nor 'lock_ref', so slots "
            "that running requests hold cannot be told apart"
        )
    return NodeShape(slots_attr, lock_attr)


def _component_node(node: Any) -> bool:
    data = getattr(node, COMPONENTS, None)
    try:
        full = data[_FULL]
    except (TypeError, IndexError, KeyError):
        return False
    return hasattr(full, "value") and hasattr(full, "lock_ref")


def component_tree(cache: Any) -> bool:
    """Whether ``cache``'s tree is made of unified-tree nodes (``component_data``) the host can read."""
    root = tree_root(cache)
    return root is not None and hasattr(getattr(root, "children", None), "items") and _component_node(root)


class _Frame:
    __slots__ = ("parent", "key", "node", "depth", "offset")

    def __init__(self, parent: Any, key: Any, node: Any, depth: int, offset: int = 0):
        self.parent = parent
        self.key = key
        self.node = node
        self.depth = depth
        self.offset = offset


class RadixCursor:
    """Resumable walk of one cache: ``next_slice(budget)`` returns at most ``budget`` rows of unlocked slots."""

    def __init__(self, cache: Any):
        self.cache = cache
        self._flat = flat_walker(cache)
        self._shape = None if self._flat is not None else node_shape(cache)
        self.passes = 0  # full passes completed
        self.pass_rows = 0  # rows handed out in the current pass
        self._stack: Optional[list[_Frame]] = None
        self._pass_root: Any = None
        self._flat_cursor = 0

    @property
    def walkable(self) -> bool:
        return self._flat is not None or self._shape is not None

    def next_slice(self, budget: int, max_nodes: Optional[int] = None) -> WalkSlice:
        """The next rows of this pass: at most ``budget`` rows, visiting at most ``max_nodes`` nodes
        (default ``budget``). A slice that ends a pass says so; the next one starts a new pass."""
        if budget < 1:
            raise ValueError(f"kv canary sweep: a slice needs a budget >= 1 rows; got {budget}")
        if self._flat is not None:
            out = self._flat_slice(budget)
        elif self._shape is not None:
            out = self._tree_slice(budget, budget if max_nodes is None else max_nodes)
        else:
            out = WalkSlice(pass_done=True)
        self.pass_rows += out.rows
        if out.pass_done:
            self.passes += 1
            self.pass_rows = 0
        return out

    # ------------------------------------------------------------------ a cache's own flat walk

    def _flat_slice(self, budget: int) -> WalkSlice:
        # Walked afresh per slice: rows kept from an older walk could name slots freed since.
        result = self._flat(unlocked_only=True, swa_resident_only=False)
        total = int(result.slot_indices.shape[0])
        start = self._flat_cursor if self._flat_cursor < total else 0
        end = min(total, start + budget)
        out = WalkSlice(pass_done=end >= total)
        if end > start:
            out.segments.append(
                FlatRows(result.slot_indices[start:end], result.positions[start:end], result.prev_slot_indices[start:end])
            )
        self._flat_cursor = 0 if out.pass_done else end
        return out

    # ------------------------------------------------------------------ structural walk

    def _tree_slice(self, budget: int, max_nodes: int) -> WalkSlice:
        shape = self._shape
        root = tree_root(self.cache)
        if self._stack is None or root is not self._pass_root:
            self._stack = [_Frame(None, None, root, 0)]
            self._pass_root = root
            self.pass_rows = 0
        stack = self._stack
        out = WalkSlice()
        rows = visited = 0
        while stack and rows < budget and visited < max(1, max_nodes):
            frame = stack.pop()
            visited += 1
            node = frame.node
            if frame.parent is not None and frame.parent.children.get(frame.key) is not node:
                continue  # evicted, or split (its upper part now sits between) since it was pushed
            slots = shape.slots(node) if node is not root else None
            if slots is not None and frame.offset < len(slots) and not shape.locked(node):
                take = min(len(slots) - frame.offset, budget - rows)
                lo = frame.offset
                prev = slots[lo - 1 : lo] if lo > 0 else self._last_slot(frame.parent, root)
                if lo > 0 and not hasattr(prev, "shape"):
                    prev = int(prev[0])
                out.segments.append(Segment(slots[lo : lo + take], frame.depth + lo, prev))
                rows += take
                if lo + take < len(slots):
                    frame.offset = lo + take
                    stack.append(frame)
                    break
            depth = frame.depth + (shape.span(node, slots) if node is not root else 0)
            stack.extend(_Frame(node, key, child, depth) for key, child in reversed(list(node.children.items())))
        if not stack:
            out.pass_done = True
            self._stack = None
        return out

    def _last_slot(self, parent: Any, root: Any) -> Any:
        """The parent's last slot (the predecessor of its child's first position), read now."""
        if parent is None or parent is root:
            return UNKNOWN_PREV  # the child starts at position 0
        slots = self._shape.slots(parent)
        if slots is None or len(slots) == 0:
            return UNKNOWN_PREV  # the parent's device KV was evicted
        last = slots[len(slots) - 1 :]
        return last if hasattr(last, "shape") else int(last[0])


def sample_idle_slot(cache: Any, rng: random.Random) -> Optional[tuple[Any, int, Any, int]]:
    """One slot the cache holds unlocked, uniformly at random, and where it sits: ``(slot, position, node,
    index)``, where ``slot`` is an int or a one-element tensor (device values are not read on the host) and is
    ``node``'s slot ``index`` (node None, index -1, for a cache that walks itself and whose nodes the host cannot
    read); None when there is none.

    sglang's unified tree walks itself (``walk_for_kv_canary``: rows, no node) but its nodes are host objects
    (``component_data``): it is sampled through them, the same rows (FULL slots whose FULL component no request
    locks), so that a flip names the node it sits in and its leaving the cache can be told (``left_cache``)."""
    walk = flat_walker(cache)
    if walk is not None and not component_tree(cache):
        result = walk(unlocked_only=True, swa_resident_only=False)
        total = int(result.slot_indices.shape[0])
        if total == 0:
            return None
        i = rng.randrange(total)
        return result.slot_indices[i : i + 1], int(result.positions[i]), None, -1
    shape = node_shape(cache)
    if shape is None:
        return None
    root = tree_root(cache)
    chosen, seen = None, 0
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        slots = shape.slots(node) if node is not root else None
        if slots is not None and len(slots) and not shape.locked(node):
            # Reservoir sampling over slots, one node at a time: uniform without a second pass.
            seen += len(slots)
            if rng.randrange(seen) < len(slots):
                chosen = (slots, depth, rng.randrange(len(slots)), node)
        span = shape.span(node, slots) if node is not root else 0
        stack.extend((child, depth + span) for child in node.children.values())
    if chosen is None:
        return None
    slots, depth, j, node = chosen
    slot = slots[j : j + 1]
    return (slot if hasattr(slot, "shape") else int(slot[0])), depth + j, node, j
