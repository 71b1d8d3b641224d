"""``req_to_token``: a request's page-table entry points at another of its slots for one forward.

Models a wrong ``req_to_token`` write (an allocator or scheduler bug): the forward reads the KV of
position ``new_position`` where position ``position`` should be. The pre-forward pass of that
forward verifies the entry and reports ``position`` (the row it finds belongs to another
position). The entry is restored after the forward, so the engine frees the slots it allocated,
not a slot twice. The remapped position is never the last one read (``prefix - 1``): the rows this
forward writes chain from that one, and a wrong chain would outlive the restore. In a target verify
whose prefixes only the device holds, the request, ``position`` and ``new_position`` are drawn on
the device (the same distribution) and logged from the device facts.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned, device_position, device_row
from canary_instrument.runtime.perturb.batch import batch_facts


class ReqToTokenRemap:
    name = "req_to_token"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        if facts is not None and facts.prefix is None:
            return self._inject_device(ctx, step, forward_batch, facts)
        rows = [r for r in range(facts.size) if facts.prefix[r] >= 2] if facts else []
        if not rows:
            return None
        r = ctx.rng.choice(rows)
        prefix = facts.prefix[r]
        p = ctx.rng.randrange(prefix - 1)
        q = ctx.rng.randrange(prefix - 1)
        q += q >= p  # another position the forward also reads: its row's position is q, never p
        table = ctx.state.req_to_token
        flat = table.view(-1)
        req = forward_batch.req_pool_indices[r : r + 1].to(torch.int64)
        at_p = req * table.stride(0) + p
        old = flat.index_select(0, at_p)
        new = flat.index_select(0, req * table.stride(0) + q)
        flat.index_copy_(0, at_p, new)
        return Planned(
            self.name, step, position=p, extra=(("new_position", q),),
            device={"req": req, "slot": old, "new_slot": new, "applied": old != new},
            undo=lambda: flat.index_copy_(0, at_p, old),
        )

    def _inject_device(self, ctx: KindContext, step: int, forward_batch: Any, facts: Any) -> Planned:
        """The same draw where only the device knows the prefixes (a target verify without host copies):
        the request, ``p`` and ``q`` are device values, and the entry changes only where the request's
        prefix allows (>= 2); otherwise the injection is logged ``applied=0``."""
        import torch

        prefix = facts.device_prefix.to(torch.int64)
        r, valid = device_row(ctx, prefix >= 2)
        last = prefix.index_select(0, r) - 1  # never remapped: the rows this forward writes chain from it
        zero = torch.zeros_like(last)
        p, p_ok = device_position(ctx, zero, last)
        q, _ = device_position(ctx, zero, last)
        q = q + (q >= p).to(torch.int64)
        valid = valid & p_ok
        table = ctx.state.req_to_token
        flat = table.view(-1)
        req = forward_batch.req_pool_indices.index_select(0, r).to(torch.int64)
        at_p = req * table.stride(0) + p
        old = flat.index_select(0, at_p)
        new = flat.index_select(0, req * table.stride(0) + q)
        flat.index_copy_(0, at_p, torch.where(valid, new, old))
        return Planned(
            self.name, step, position=-1,
            device={"req": req, "slot": old, "position": p, "new_position": q, "new_slot": new,
                    "applied": valid & (old != new)},
            undo=lambda: flat.index_copy_(0, at_p, old),
        )
