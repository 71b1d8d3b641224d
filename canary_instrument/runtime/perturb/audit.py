"""Why an injection went unreported: nothing could read it any more, or the canary missed it.

A flipped real-KV bit is only reported when something reads the slot: a request, the idle-cache
sweep, a request reusing the prefix. The engine may free the slot first (a duplicate prefix
freed when a request finished, an evicted cache entry) and then either hand it to a new token,
which rewrites the KV and its canary row, or leave it free. Neither is a canary miss: nothing
consumes the corrupted bytes. Run at the end of a soak, after requests have finished and the
sweep has passed over the cache, ``audit`` sorts every missed injection into

- ``overwritten``: the slot's stored fingerprint matches its KV again (rewritten since);
- ``unreachable``: still corrupt, but neither the cache nor a request holds the slot (freed);
- (``premature_free``: ``overwritten`` when the row no longer reads as freed, ``unreachable`` when
  nothing holds the slot);
- ``undetected``: still corrupt and still held, or a kind whose reader is the very forward it
  corrupted: a real miss.

It reads device tensors on the host and is meant for the end of a run, not for a serving step.
"""

from __future__ import annotations

from typing import Any, Iterable

from canary_instrument.runtime.perturb.score import Score

_REAL_KV = ("real_kv_used", "real_kv_post_forward", "real_kv_unused_cache", "real_kv_layer")
_GROUPS = {"full": 0, "swa": 1}
_HALVES = {"k": 0, "v": 1}


def held_slots(cache: Any) -> set:
    """Every full slot the prefix cache holds, locked or not (host values; reads the device)."""
    from canary_instrument.runtime.features.radix_walk import flat_walker, node_shape, tree_root

    walk = flat_walker(cache) if cache is not None else None
    if walk is not None:
        return set(walk(unlocked_only=False, swa_resident_only=False).slot_indices.tolist())
    shape = node_shape(cache) if cache is not None else None
    if shape is None:
        return set()
    root = tree_root(cache)
    held, stack = set(), [root]
    while stack:
        node = stack.pop()
        slots = shape.slots(node) if node is not root else None
        if slots is not None:
            held.update(int(s) for s in (slots.tolist() if hasattr(slots, "tolist") else slots))
        stack.extend(node.children.values())
    return held


def audit(result: Score, state: Any, cache: Any = None, running_slots: Iterable[int] = ()) -> dict[str, list]:
    """``{"overwritten": [...], "unreachable": [...], "undetected": [...]}`` of ``result``'s missed injections."""
    from canary_instrument.runtime.passes import hashing
    from canary_instrument.runtime.passes.layers import layer_words, stored_fingerprint
    from canary_instrument.runtime.perturb.base import fingerprinted_bytes
    from canary_instrument.runtime.passes.state import FREED_POSITION

    out: dict[str, list] = {"overwritten": [], "unreachable": [], "undetected": []}
    full_held = held_slots(cache) | {int(s) for s in running_slots}
    words = fingerprinted_bytes(state) // 8 if state.realkv != "none" else 0
    for kind in result.kinds.values():
        for injection in kind.missed:
            if injection.kind == "premature_free":
                # Rewritten by the slot's next writer after the engine's own free, else freed and unread.
                if int(state.groups[0].rows[injection.slot, 1]) != FREED_POSITION:
                    out["overwritten"].append(injection)
                else:
                    out["undetected" if injection.slot in full_held else "unreachable"].append(injection)
                continue
            if injection.kind not in _REAL_KV:
                out["undetected"].append(injection)
                continue
            group = next(g for g in state.groups
                         if (g.group, g.half) == (_GROUPS[injection.group], _HALVES[injection.half]))
            layer = injection.get("layer", 0)
            stored = int(stored_fingerprint(group, injection.slot, layer))
            now = int(hashing.fingerprint(layer_words(group, layer)[injection.slot : injection.slot + 1, :words])[0])
            if stored in (0, now):
                out["overwritten"].append(injection)
                continue
            held = full_held
            if group.group == 1:
                mapping = state.swa_mapping
                held = {int(mapping[s]) for s in full_held if 0 < s < mapping.shape[0]}
            out["undetected" if injection.slot in held else "unreachable"].append(injection)
    return out
