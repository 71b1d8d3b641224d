"""Request-side kinds: a scheduler mixing up two requests' req-pool rows, a forward writing KV to another
slot than req_to_token names, and a slot freed while a request still reads it.

- ``req_row_swap`` (before a decode or target-verify forward): two running requests of the batch exchange
  their req_to_token entries for positions ``[0, L)``, ``L`` the shorter prefix. The shorter request then
  reads a self-consistent prefix of the other's chain, which only the identity check reports (``identity``
  at ``L - 1``); the longer one also breaks its link at ``L``. The entries are restored after the forward; the row the
  shorter request wrote at ``L`` chains from the other's history, as with the real bug, so its later
  reads report ``link`` there.
- ``write_slot`` (before the forward): two new tokens of the batch exchange their ``out_cache_loc``
  entries, so each one's KV lands in the other's slot; the post-forward pass reports ``write_slot`` at
  both positions. ``out_cache_loc`` is restored after the forward; the KV cannot be.
- ``premature_free`` (after the forward): one slot a running request reads is handed to the canary's KV
  free wrapper as the allocator's ``free`` would (it is not returned to the allocator, so nothing is
  reused); the request's next read reports ``freed``. The row reads as freed until the request
  finishes and its real free and the next writer take over.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned
from canary_instrument.runtime.perturb.batch import batch_facts


class ReqRowSwap:
    name = "req_row_swap"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        # Running requests (decode, target verify): each has run a forward, so each has an identity entry.
        if facts is None or facts.prefix is None or facts.mode not in ("decode", "verify"):
            return None
        rows = [r for r in range(facts.size) if facts.prefix[r] >= 1]
        if len(rows) < 2:
            return None
        a, b = ctx.rng.sample(rows, 2)
        if facts.prefix[a] > facts.prefix[b]:
            a, b = b, a
        length = facts.prefix[a]
        table = ctx.state.req_to_token
        flat = table.view(-1)
        rpi = forward_batch.req_pool_indices
        req_a, req_b = rpi[a : a + 1].to(torch.int64), rpi[b : b + 1].to(torch.int64)
        span = torch.arange(length, device=table.device, dtype=torch.int64)
        at_a, at_b = req_a * table.stride(0) + span, req_b * table.stride(0) + span
        old_a, old_b = flat.index_select(0, at_a), flat.index_select(0, at_b)
        flat.index_copy_(0, at_a, old_b)
        flat.index_copy_(0, at_b, old_a)

        def undo() -> None:
            flat.index_copy_(0, at_a, old_a)
            flat.index_copy_(0, at_b, old_b)

        return Planned(
            self.name, step, position=length - 1, extra=(("length", length),),
            device={"req": req_a, "other_req": req_b, "slot": old_a[-1:], "new_slot": old_b[-1:],
                    "applied": (old_a != old_b).any().reshape(1)},
            undo=undo,
        )


class WriteSlot:
    name = "write_slot"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        loc = getattr(forward_batch, "out_cache_loc", None)
        if facts is None or facts.prefix is None or loc is None or facts.tokens < 2:
            return None
        i, j = ctx.rng.sample(range(facts.tokens), 2)
        row_i, pos_i = facts.token_owner(i)
        row_j, pos_j = facts.token_owner(j)
        slot_i, slot_j = loc[i : i + 1].clone(), loc[j : j + 1].clone()
        loc[i : i + 1].copy_(slot_j)
        loc[j : j + 1].copy_(slot_i)

        def undo() -> None:
            loc[i : i + 1].copy_(slot_i)
            loc[j : j + 1].copy_(slot_j)

        rpi = forward_batch.req_pool_indices
        return Planned(
            self.name, step, position=pos_i, extra=(("other_position", pos_j),),
            device={"req": rpi[row_i : row_i + 1].to(torch.int64), "other_req": rpi[row_j : row_j + 1].to(torch.int64),
                    "slot": slot_i.to(torch.int64), "other_slot": slot_j.to(torch.int64),
                    "applied": slot_i != slot_j},
            undo=undo,
        )


class PrematureFree:
    name = "premature_free"
    hook = "after_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        side = ctx.state.extra.get("request_side")
        facts = batch_facts(forward_batch)
        if side is None or facts is None or facts.prefix is None:
            return None
        # Positions the request's next forward reads: its prefix and what this forward kept (a target
        # verify keeps its first new position for sure; the others are draft guesses).
        kept = [facts.prefix[r] + (1 if facts.mode == "verify" else facts.new[r]) for r in range(facts.size)]
        rows = [r for r in range(facts.size) if kept[r] >= 1]
        if not rows:
            return None
        r = ctx.rng.choice(rows)
        position = ctx.rng.randrange(kept[r])
        table = ctx.state.req_to_token
        req = forward_batch.req_pool_indices[r : r + 1].to(torch.int64)
        slot = table.view(-1).index_select(0, req * table.stride(0) + position).to(torch.int64)
        side.on_free(slot)
        return Planned(self.name, step, position=position, device={"req": req, "slot": slot, "applied": slot > 0})
