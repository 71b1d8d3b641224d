"""``req_to_token``: a request's page-table entry points at another of its slots for one forward.

Models a wrong ``req_to_token`` write (an allocator or scheduler bug): the forward reads the KV of
position ``new_position`` where position ``position`` should be. The pre-forward pass of that
forward verifies the entry and reports ``position`` (the row it finds belongs to another
position). The entry is restored after the forward, so the engine frees the slots it allocated,
not a slot twice. The remapped position is never the last one read (``prefix - 1``): the rows this
forward writes chain from that one, and a wrong chain would outlive the restore.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned
from canary_instrument.runtime.perturb.batch import batch_facts


class ReqToTokenRemap:
    name = "req_to_token"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
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
