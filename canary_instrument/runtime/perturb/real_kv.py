"""The real-KV kinds: one bit of one layer's KV flipped inside the bytes the fingerprint covers.

- ``real_kv_used``: a slot a request of this batch reads (a stray write into live KV), in the layer
  that request's pre-forward pass fingerprints this forward (realkv=partial: its rotation's layer,
  a device value; all: any layer). Flipped before the forward, so its pre-forward pass reports
  ``fingerprint``; restored after the forward, so the damage stays with the forward that read it.
- ``real_kv_layer``: the same slot choice, in any layer, not restored: the request's pre-forward
  passes report it once the rotation reaches that layer (within ``layers`` of its forwards).
- ``real_kv_post_forward``: a slot this forward just wrote, after its post-forward pass stored
  the fingerprint (a corrupted transfer or a late overwrite); in a target verify, a request's first
  position (the draft guesses after it may be rejected); in the SWA group, one of a request's last
  window of positions (the engine releases the others unread). Whoever reads the slot next reports
  it: the request's next forward, the idle-cache sweep, or a request reusing the prefix.
- ``real_kv_unused_cache``: a slot the prefix cache holds while no request locks it. Only the
  idle-cache sweep, or a request reusing the prefix, can find it; the perturber watches its node and logs
  when the slot leaves the cache unread (``left_cache``).

The last three are not restored: by the time it would be safe, the slot may belong to someone else;
they flip a layer drawn uniformly from the group's layers.
In a target verify whose prefixes only the device holds, ``real_kv_used`` draws the request and
the position on the device, and ``real_kv_post_forward``'s position (the request's prefix) is a
device value; both log the position from the device facts.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import (
    GROUP_NAMES,
    HALF_NAMES,
    KindContext,
    Planned,
    device_position,
    device_row,
    fingerprinted_bytes,
    flip_bit,
    host_to_device,
    pick_group,
)
from canary_instrument.runtime.passes.layers import cursor_table, layer_count, layer_words
from canary_instrument.runtime.perturb.batch import batch_facts
from canary_instrument.runtime.features.radix_walk import sample_idle_slot


def _resolve(state: Any, group: Any, full_slot: Any) -> tuple[Any, Any]:
    """(row index of ``group``, valid) for a full slot (a one-element device tensor)."""
    import torch

    full_ok = (full_slot > 0) & (full_slot < state.groups[0].rows.shape[0])
    if group.group == 0:
        return full_slot, full_ok
    mapped = state.swa_mapping.index_select(0, torch.where(full_ok, full_slot, 0)).to(torch.int64)
    return mapped, full_ok & (mapped > 0) & (mapped < group.rows.shape[0])


def _flip(ctx: KindContext, name: str, step: int, group: Any, full_slot: Any, position: Any,
          device: dict, restore: bool, valid: Any = None, layer: Any = None) -> Planned:
    """``position``: a host int, or a one-element device tensor (logged as the device fact ``position``);
    ``valid``: a device bool the target's own draw adds (an empty range flips nothing); ``layer``: a host int, a
    one-element device tensor (logged as the device fact ``layer``), or None for one drawn here."""
    slot, resolved = _resolve(ctx.state, group, full_slot)
    valid = resolved if valid is None else resolved & valid
    byte = ctx.rng.randrange(fingerprinted_bytes(ctx.state))
    bit = ctx.rng.randrange(8)
    if layer is None:
        layer = ctx.rng.randrange(layer_count(group))
    extra = (("byte", byte), ("bit", bit))
    if hasattr(layer, "shape"):
        # Only the device knows the layer: flip in each layer where it is the one (the rest are no-ops).
        undos = [flip_bit(layer_words(group, i), slot, valid & (layer == i), byte, bit)
                 for i in range(layer_count(group))]
        device = {**device, "layer": layer}

        def undo() -> None:
            for one in undos:
                one()
    else:
        undo = flip_bit(layer_words(group, layer), slot, valid, byte, bit)
        extra = (("layer", layer),) + extra
    if hasattr(position, "shape"):
        device, position = {**device, "position": position}, -1
    return Planned(
        name, step, position=position, group=GROUP_NAMES[group.group], half=HALF_NAMES[group.half],
        extra=extra, device={**device, "slot": slot, "applied": valid},
        undo=undo if restore else None,
    )


def checked_layer(ctx: KindContext, group: Any, req: Any) -> Any:
    """The layer the pre-forward pass of req-pool row ``req`` (a device tensor) fingerprints this forward: the
    rotation's (a device value) with realkv=partial, any (drawn here) with all."""
    if ctx.state.realkv == "partial":
        return cursor_table(ctx.state).index_select(0, req.reshape(-1)) % layer_count(group)
    return None


def used_target(ctx: KindContext, forward_batch: Any, forwards: int = 0) -> Optional[tuple]:
    """(group, full slot, position, device facts, valid) of a slot a request of this batch reads, or None.

    ``forwards``: how many of the request's forwards, this one included, must read the slot. Only the SWA
    group drops positions as the request grows (its window), so there the position is drawn from the part
    of the window that stays in it that long at this forward's tokens per request (a decode's or a target
    verify's growth per forward); an extend, whose next forwards grow otherwise, offers no such target.
    ``valid`` is None where the host drew the request and position, a device bool where only the device
    knows the prefixes (a target verify without host copies); the request is in the facts as ``req``."""
    import torch

    facts = batch_facts(forward_batch)
    group = pick_group(ctx)
    if group is None:
        return None
    if facts is not None and facts.prefix is None:
        prefix = facts.device_prefix.to(torch.int64)
        r, valid = device_row(ctx, prefix >= 1)
        high = prefix.index_select(0, r)
        # The SWA group verifies (and attention reads) only the request's last window of positions.
        keep = ctx.state.swa_window - max(0, forwards - 1) * max(facts.new, default=1)
        if group.group == 1 and keep < 1:
            return None
        low = (high - keep).clamp(min=0) if group.group == 1 else torch.zeros_like(high)
        position, in_range = device_position(ctx, low, high)
        req = forward_batch.req_pool_indices.index_select(0, r).to(torch.int64)
        valid = valid & in_range
    else:
        lows = [0] * facts.size if facts else []
        if facts and group.group == 1:
            if forwards > 1 and facts.mode == "extend":
                return None
            grown = [max(0, forwards - 1) * new for new in facts.new]
            lows = [max(0, p - ctx.state.swa_window + g) for p, g in zip(facts.prefix, grown)]
        rows = [r for r in range(facts.size) if facts.prefix[r] >= 1 and lows[r] < facts.prefix[r]] if facts else []
        if not rows:
            return None
        r = ctx.rng.choice(rows)
        prefix = facts.prefix[r]
        position = ctx.rng.randrange(lows[r], prefix)
        req = forward_batch.req_pool_indices[r : r + 1].to(torch.int64)
        valid = None
    table = ctx.state.req_to_token
    full_slot = table.view(-1).index_select(0, req * table.stride(0) + position).to(torch.int64)
    return group, full_slot, position, {"req": req}, valid


class UsedRowKind:
    """A kind that corrupts, before the forward, a row of a request the forward is about to read: ``corrupt``
    gets ``used_target``'s pick (by the layer rotation where ``rotate``)."""

    name = ""
    hook = "before_forward"
    rotate = False

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        found = used_target(ctx, forward_batch, forwards=_rotation(ctx) if self.rotate else 0)
        if found is None:
            return None
        return self.corrupt(ctx, step, *found)

    def corrupt(self, ctx: KindContext, step: int, group: Any, full_slot: Any, position: Any, device: dict,
                valid: Any) -> Optional[Planned]:
        raise NotImplementedError


class RealKvUsed(UsedRowKind):
    name = "real_kv_used"

    def corrupt(self, ctx, step, group, full_slot, position, device, valid):
        layer = checked_layer(ctx, group, device["req"])
        return _flip(ctx, self.name, step, group, full_slot, position, device, restore=True, valid=valid, layer=layer)


class RealKvLayer(UsedRowKind):
    name = "real_kv_layer"
    rotate = True

    def corrupt(self, ctx, step, group, full_slot, position, device, valid):
        return _flip(ctx, self.name, step, group, full_slot, position, device, restore=False, valid=valid)


def _rotation(ctx: KindContext) -> int:
    """Forwards, this one included, until the rotation has checked every layer of a group (realkv=all: this
    one)."""
    if ctx.state.realkv != "partial":
        return 1
    return max(layer_count(g) for g in ctx.state.groups)


def _last_windows(facts: Any, window: int) -> list[int]:
    """Indices of the batch's new tokens that fall in their request's last ``window`` positions."""
    found, start = [], 0
    for new in facts.new:
        found.extend(range(start + max(0, new - window), start + new))  # the request's last min(new, window)
        start += new
    return found


class RealKvPostForward:
    name = "real_kv_post_forward"
    hook = "after_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        group = pick_group(ctx)
        if not facts or not facts.tokens or group is None:
            return None
        if facts.mode == "verify":
            # Only a request's first verified position is sure to be kept: the draft guesses after it may be
            # rejected (their slots freed, or written again by the next window), and a flip there is never read.
            # Its position is the request's prefix, a device value when the batch has no host copy.
            r = ctx.rng.randrange(facts.size)
            token = sum(facts.new[:r])
            position = facts.prefix[r] if facts.prefix is not None else facts.device_prefix[r : r + 1]
        elif group.group == 1:
            # The SWA group keeps, and its next pass verifies, only each request's last window of positions;
            # the engine releases the rest unread, so a flip there could never be reported (nor harm).
            token = ctx.rng.choice(_last_windows(facts, ctx.state.swa_window))
            r, position = facts.token_owner(token)
        else:
            token = ctx.rng.randrange(facts.tokens)
            r, position = facts.token_owner(token)
        full_slot = forward_batch.out_cache_loc[token : token + 1].to(torch.int64)
        req = forward_batch.req_pool_indices[r : r + 1].to(torch.int64)
        return _flip(ctx, self.name, step, group, full_slot, position, {"req": req}, restore=False)


class RealKvUnusedCache:
    name = "real_kv_unused_cache"
    hook = "step_end"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        group = pick_group(ctx)
        found = sample_idle_slot(cache, ctx.rng) if cache is not None and group is not None else None
        if found is None:
            return None
        slot, position, node, index = found
        device = ctx.state.req_to_token.device
        if hasattr(slot, "device") and slot.device == device:
            full_slot = slot.reshape(1).to(torch.int64)
        else:
            full_slot = host_to_device([int(slot.reshape(-1)[0]) if hasattr(slot, "shape") else int(slot)], device)
        planned = _flip(ctx, self.name, step, group, full_slot, position, {}, restore=False)
        if node is not None:
            planned.watch = (node, index)  # the perturber notes when the slot leaves the cache unread
        return planned
