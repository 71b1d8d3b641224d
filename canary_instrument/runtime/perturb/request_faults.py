"""Request-side kinds: a scheduler mixing up two requests' req-pool rows, a forward writing KV to another
slot than req_to_token names, and a slot freed while a request still reads it.

- ``req_row_swap`` (before a decode or target-verify forward): two running requests of the batch exchange their
  req_to_token entries for positions ``[0, L)``, ``L`` the shorter prefix. The shorter request then
  reads a self-consistent prefix of the other's chain, which only the identity check reports
  (``identity`` at ``L - 1``); the longer one also breaks its link at ``L``. After the forward the
  entries are restored, and so are the links (and identity entries) of the rows the forward wrote
  chained from the other's history: nothing is left for later reads to report. Two requests whose first
  ``L`` tokens are the same (a prompt sent twice, greedy outputs alike) hold the same KV there: the swap
  then changes nothing either of them reads, and is logged ``applied=0`` (their rows at ``L - 1`` hold
  the same token and link, the chain's digest of every token before); on an SWA pool only where both
  prefixes are ``L`` (else the longer one's window reaches slots whose SWA rows the shorter one released).
- ``write_slot`` (before the forward): two new tokens of the batch exchange their ``out_cache_loc``
  entries, so each one's KV lands in the other's slot; the post-forward pass reports ``write_slot`` at
  both positions. ``out_cache_loc`` is restored after the forward; the KV cannot be. Not on a batch whose
  forward was prepared before the site (``batch.planned_before_the_forward``: sglang's spec-v2 target verify
  replays a graph whose write locations were copied then, and neither its attention nor the canary's check
  reads the batch's again, so the exchange would change nothing).
- ``premature_free`` (before the forward): one slot a request of the batch reads is marked freed as the
  KV allocator's wrapped ``free`` marks it (it is not returned to the allocator, so nothing is reused);
  that forward's pre-forward pass reports ``freed`` there (and ``link`` at the next position). The
  position is never one a request of the batch reads last (its new rows chain from that one). The
  mark is taken back after the forward. The wrapped ``free`` itself defers the mark to the next
  forward's start (``runtime/checks/request_side.py``); its path is tested on the engine.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned
from canary_instrument.runtime.perturb.batch import batch_facts, planned_before_the_forward


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
        # Equal histories (the same token and link at L - 1) make the swap invisible and harmless, unless the
        # longer request's SWA window reaches below the shorter one's (whose SWA slots there are released).
        rows = ctx.state.groups[0].rows
        last_a = rows.index_select(0, old_a[-1:].to(torch.int64))
        last_b = rows.index_select(0, old_b[-1:].to(torch.int64))
        differs = (last_a[:, 0] != last_b[:, 0]) | (last_a[:, 2] != last_b[:, 2])
        if ctx.state.swa_mapping is not None and facts.prefix[b] != length:
            differs = torch.ones_like(differs)

        # The new rows of requests whose prefix is L chained from the other's row at L - 1.
        chained = [(req_a, facts.new[a])] + ([(req_b, facts.new[b])] if facts.prefix[b] == length else [])

        def undo() -> None:
            flat.index_copy_(0, at_a, old_a)
            flat.index_copy_(0, at_b, old_b)
            for req, count in chained:
                for position in range(length, length + count):  # in order: each link derives from the last
                    _relink(ctx.state, req, position)

        return Planned(
            self.name, step, position=length - 1, extra=(("length", length),),
            device={"req": req_a, "other_req": req_b, "slot": old_a[-1:], "new_slot": old_b[-1:],
                    "applied": (old_a != old_b).any().reshape(1) & differs},
            undo=undo,
        )


def _relink(state: Any, req: Any, position: int) -> None:
    """Recompute the link of request ``req``'s row at ``position`` (a row the forward wrote) from its own row
    at ``position - 1`` in every group and half, and its identity entry's link there; device ops only."""
    import torch

    from canary_instrument.runtime.passes import hashing
    from canary_instrument.runtime.passes.state import GROUP_SWA

    table = state.req_to_token
    flat = table.view(-1)
    here = flat.index_select(0, req * table.stride(0) + position).to(torch.int64)
    before = flat.index_select(0, req * table.stride(0) + position - 1).to(torch.int64)
    for group in state.groups:
        n = group.rows.shape[0]
        slot, prev = here, before
        if group.group == GROUP_SWA:
            slot, prev = state.swa_mapping.index_select(0, slot), state.swa_mapping.index_select(0, prev)
        ok = (slot > 0) & (slot < n) & (prev > 0) & (prev < n)
        slot, prev = torch.where(ok, slot, 0), torch.where(ok, prev, 0)
        row = group.rows.index_select(0, prev)
        link = hashing.next_link(row[:, 0], row[:, 1], row[:, 2])
        links = group.rows[:, 2]
        links.index_copy_(0, slot, torch.where(ok, link, links.index_select(0, slot)))
        if state.identity is not None and (group.group, group.half) == (0, 0):
            entry = state.identity.index_select(0, req)
            mine = ok & (entry[:, 0] == position)
            entry[:, 2] = torch.where(mine, link, entry[:, 2])
            state.identity.index_copy_(0, req, entry)


class WriteSlot:
    name = "write_slot"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        loc = getattr(forward_batch, "out_cache_loc", None)
        if facts is None or facts.prefix is None or loc is None or facts.tokens < 2:
            return None
        if planned_before_the_forward(forward_batch):
            return None  # the forward writes where its copy of out_cache_loc, taken before this site, says
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
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        from canary_instrument.runtime.checks.request_side import mark_freed

        facts = batch_facts(forward_batch)
        if facts is None or facts.prefix is None:
            return None
        # A position this forward reads, and no request's last read one (prefix - 1): the rows a forward writes
        # chain from that one, and a link derived from the marked row would outlive the mark.
        ends = set(facts.prefix)  # a request sharing the slot may end its prefix right after it
        rows = [r for r in range(facts.size) if facts.prefix[r] >= 2]
        if not rows:
            return None
        r = ctx.rng.choice(rows)
        positions = [p for p in range(facts.prefix[r] - 1) if p + 1 not in ends]
        if not positions:
            return None
        position = ctx.rng.choice(positions)
        table = ctx.state.req_to_token
        req = forward_batch.req_pool_indices[r : r + 1].to(torch.int64)
        slot = table.view(-1).index_select(0, req * table.stride(0) + position).to(torch.int64)
        full = [g for g in ctx.state.groups if g.group == 0]
        kept = [g.rows[:, 1].index_select(0, slot) for g in full]
        mark_freed(ctx.state, slot)

        def undo() -> None:
            for group, old in zip(full, kept):
                group.rows[:, 1].index_copy_(0, slot, old)

        return Planned(self.name, step, position=position, device={"req": req, "slot": slot, "applied": slot > 0},
                       undo=undo)
