"""Which flips of a cached slot left the prefix cache before anything read them, told on the host.

A ``real_kv_unused_cache`` flip lands in a slot the prefix cache holds while no request locks it. Only a
request reusing the prefix or the idle-cache sweep reads it there; under eviction pressure the cache may
evict the node first, and the allocator hands the slot to a new token that rewrites its KV and canary row:
nobody ever reads the flipped bytes. ``CacheWatch`` keeps the node the slot sits in and, at each later step
end, looks at the tree (host structure only: no device value is read, nothing waits for the device). When
the slot has left the cache with no request having held it, it logs one line and forgets the injection:

```
kv_canary_perturb_left_cache= step=73 kind=real_kv_unused_cache injected=41 position=52 how=evicted
```

``step`` is the step at whose end it was seen gone (it left during that step), ``injected`` and ``position``
name the injection (its line's ``step`` and ``position``; one such injection per step), ``how``:

- ``evicted``: its node is no longer its parent's child and has no children (a leaf the cache evicted);
- ``freed``: its node's device KV is gone while the node stays (``value`` None: HiCache kept a host copy, the
  device slot is free; a node out of the tree with its value cleared, as sglang's unified tree evicts, is ``evicted``);
- ``replaced``: its node holds other slots of the same length (freed and loaded back, or an SWA tombstone
  revived with a request's slots, between two step ends);
- ``swa_freed``: an SWA-group flip whose node's SWA slots the cache freed, the full ones kept (an SWA tree's
  tombstone; in sglang's unified tree, the SWA component's value None);
- ``reset``: the cache's root was replaced (a flush frees every slot).

A node split since (the upper part becomes a new parent; the original node keeps the lower part) moves the
slot to whichever part holds it. A request locking the node (it reads the prefix; a lock spans its forwards,
and this runs at a forward's step end) ends the watch with no line: the flip was readable. So does anything
the watch cannot vouch for (a node merged into its parent, a value that shrank in place), and so does the
limit on how many are watched (the oldest goes): those stay plain misses when nothing reports them.
``score`` counts a missed injection with such a line as *evicted unread*, apart from the misses.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.features.radix_walk import node_shape, tree_root
from canary_instrument.runtime.reports.loglines import LogLine

PREFIX = "kv_canary_perturb_left_cache="
MAX_WATCHED = 32  # injections watched at once (one per step at most: a step-end kind at its rate)
_MAX_CHAIN = 64  # split parts walked up from a node to its old parent
_DROP = "drop"  # stop watching, no line


@dataclass(frozen=True)
class LeftCache(LogLine):
    PREFIX = PREFIX

    step: int  # the step at whose end the slot was seen gone
    kind: str
    injected: int  # the injection's step
    position: int  # the injection's position
    how: str

    def fields(self) -> list:
        return [("step", self.step), ("kind", self.kind), ("injected", self.injected), ("position", self.position),
                ("how", self.how)]

    @classmethod
    def from_fields(cls, fields: list) -> "LeftCache":
        values = dict(fields)
        return cls(step=int(values["step"]), kind=values["kind"], injected=int(values["injected"]),
                   position=int(values["position"]), how=values["how"])

    @property
    def names(self) -> tuple:
        """(kind, step, position) of the injection it names (``Injection``'s fields)."""
        return self.kind, self.injected, self.position


class _Watched:
    __slots__ = ("kind", "step", "position", "swa", "root", "shape", "node", "index", "parent", "key", "holding",
                 "length")


def _holding(w: _Watched, node: Any) -> Any:
    return w.shape.holding(node)


def _size(w: _Watched, holding: Any) -> int:
    return 1 if w.shape.slots_attr == "slot" else len(holding)


def _key_of(parent: Any, node: Any) -> Any:
    """``node``'s key among ``parent``'s children (identity), or None when it is not one."""
    return next((k for k, c in parent.children.items() if c is node), None)


class CacheWatch:
    def __init__(self, limit: int = MAX_WATCHED):
        self._watched: deque = deque()
        self.limit = limit
        self.dropped = 0  # watches ended by the limit

    def __len__(self) -> int:
        return len(self._watched)

    def add(self, cache: Any, kind: str, step: int, position: int, group: str, node: Any, index: int) -> None:
        """Watch slot ``index`` of ``node`` (a node of ``cache``'s tree), flipped by ``kind`` at ``step``."""
        shape = node_shape(cache)
        holding = shape.holding(node) if shape is not None else None
        if shape is None or holding is None or node.parent is None:
            return
        w = _Watched()
        w.kind, w.step, w.position, w.swa = kind, step, position, group == "swa"
        w.root, w.shape = tree_root(cache), shape
        self._settle(w, node, index)
        if len(self._watched) >= self.limit:
            self._watched.popleft()
            self.dropped += 1
        self._watched.append(w)

    def check(self, cache: Any, step: int) -> list[LeftCache]:
        """The watched slots seen gone since the last check, as lines (the caller logs them); forgets those and
        the ones the watch ends on."""
        if not self._watched or cache is None:
            return []
        out, kept = [], deque()
        for w in self._watched:
            how = self._where(w, cache)
            if how is None:
                kept.append(w)
            elif how != _DROP:
                out.append(LeftCache(step=step, kind=w.kind, injected=w.step, position=w.position, how=how))
        self._watched = kept
        return out

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _settle(w: _Watched, node: Any, index: int) -> None:
        w.node, w.index, w.parent = node, index, node.parent
        w.key = _key_of(node.parent, node)
        w.holding = _holding(w, node)
        w.length = _size(w, w.holding)

    def _where(self, w: _Watched, cache: Any) -> Optional[str]:
        """How the slot left the cache, None while it is there, or _DROP."""
        if tree_root(cache) is not w.root:
            return "reset"
        node = w.node
        if node.parent is not w.parent:
            how = self._follow_split(w)
            if how is not None:
                return how
            node = w.node
        holding = _holding(w, node)
        if holding is None:
            # A leaf taken out of the tree with its value cleared (sglang's unified tree) was evicted; a node still
            # in it lost its device KV alone (HiCache).
            detached = w.parent.children.get(w.key) is not node and not node.children
            return "evicted" if detached else "freed"
        if not (holding is w.holding if w.shape.slots_attr != "slot" else holding == w.holding):
            size = _size(w, holding)
            if size == w.length:
                return "replaced"
            if size < w.length:
                return _DROP
            w.holding, w.length = holding, size  # an SWA merge appended its child's slots: ours stay in front
        if w.parent.children.get(w.key) is not node:
            return _DROP if node.children else "evicted"  # a merged node keeps its children's mapping
        if w.shape.locked(node):
            return _DROP  # a request holds it: it reads the slot from here
        if w.swa and w.shape.swa_freed(node):
            return "swa_freed"
        return None

    def _follow_split(self, w: _Watched) -> Optional[str]:
        """The node was split since (new parts between it and its old parent, each holding slots from the front
        of what it held): move the watch to the part that holds the slot. None when it moved, else how it left
        or _DROP."""
        chain, x = [], w.node
        while x is not w.parent:
            chain.append(x)
            x = x.parent
            if x is None or len(chain) > _MAX_CHAIN:
                return _DROP
        index, above = w.index, 0
        for part in reversed(chain[1:]):  # top-down: the upper parts, then the node itself
            holding = _holding(w, part)
            if holding is None:
                return "freed"  # device KV goes leaf-first: the parts below it hold none either
            size = _size(w, holding)
            if index < size:
                self._settle(w, part, index)
                return None
            index -= size
            above += size
        holding = _holding(w, w.node)
        if holding is None:
            return "freed"
        if _size(w, holding) != w.length - above:
            return _DROP
        self._settle(w, w.node, index)
        return None
