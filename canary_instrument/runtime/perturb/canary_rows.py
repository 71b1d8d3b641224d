"""Kinds that corrupt the canary's own rows of a slot a request of this batch reads, before the forward.

- ``fingerprint_zeroed``: a zeroing bug clears the stored fingerprint of one layer (layer 0's is the
  row's field 3, layers 1..'s the group's table), then a bit of that layer's KV flips. Nothing
  compares a missing fingerprint with the KV, so the canary reports the hole itself: ``unwritten``,
  at the next pass for layer 0 (every pass checks field 3 is set), when the rotation reaches the
  layer for the others (within ``layers`` of the request's forwards; realkv=all: the next pass).
- ``row_high_bit``: one bit of the row's token word that the chain does not key (32-63) flips;
  the next pass reports ``row_bits``.

Neither is restored: the rows are the canary's alone, and a later write of the slot replaces them.
"""

from __future__ import annotations

from typing import Any

from canary_instrument.runtime.passes.layers import fingerprint_table, layer_count
from canary_instrument.runtime.perturb.base import GROUP_NAMES, HALF_NAMES, Planned
from canary_instrument.runtime.perturb.real_kv import UsedRowKind, _flip, _resolve


def _rewrite_word(table: Any, column: int, slot: Any, valid: Any, change) -> None:
    """``table[slot, column] = change(old)`` where ``valid`` (device tensors), by row gather and scatter."""
    import torch

    index = torch.where(valid, slot, torch.zeros_like(slot)).reshape(1)
    row = table.index_select(0, index)
    row[:, column] = torch.where(valid.reshape(1), change(row[:, column]), row[:, column])
    table.index_copy_(0, index, row)


class FingerprintZeroed(UsedRowKind):
    name = "fingerprint_zeroed"
    rotate = True

    def corrupt(self, ctx, step, group, full_slot, position, device, valid):
        import torch

        layer = ctx.rng.randrange(layer_count(group))
        slot, resolved = _resolve(ctx.state, group, full_slot)
        ok = resolved if valid is None else resolved & valid
        table, column = (group.rows, 3) if layer == 0 else (fingerprint_table(group), layer - 1)
        _rewrite_word(table, column, slot, ok, torch.zeros_like)
        return _flip(ctx, self.name, step, group, full_slot, position, device, restore=False, valid=valid, layer=layer)


class RowHighBit(UsedRowKind):
    name = "row_high_bit"

    def corrupt(self, ctx, step, group, full_slot, position, device, valid):
        slot, resolved = _resolve(ctx.state, group, full_slot)
        ok = resolved if valid is None else resolved & valid
        bit = ctx.rng.randrange(32, 64)
        # A host scalar (as a signed int64: bit 63 is the sign), so the XOR needs no host-to-device copy.
        mask = (1 << bit) - ((1 << 64) if bit == 63 else 0)
        _rewrite_word(group.rows, 0, slot, ok, lambda token: token ^ mask)
        if hasattr(position, "shape"):
            device, position = {**device, "position": position}, -1
        return Planned(
            self.name, step, position=position, group=GROUP_NAMES[group.group], half=HALF_NAMES[group.half],
            extra=(("bit", bit),), device={**device, "slot": slot, "applied": ok},
        )
