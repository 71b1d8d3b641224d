"""``next_token_swap``: two requests of a decode (or target-verify) batch exchange their next input tokens.

Models a sampler or scheduler bug that hands a request another request's token. The KV of both
positions is computed from the wrong token and the canary rows written for them carry it, so the
sampled-token check (the token the sampler produced for each request's row) reports ``token`` at
both positions in that forward's post-forward pass, and the rows carry the wrong token wherever
they are read later (in a target verify, the first token of each request: the EAGLE draft's
comparison with the target's rows reports it). The tokens are device values: the host picks one request and a random order
of the others, and the device swaps with the first request in that order whose token differs
(none differs: nothing is swapped and the injection is logged ``applied=0``). In a target verify
whose prefixes only the device holds, both positions are device values too, logged from the device
facts. It cannot be undone: the KV has been computed.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned, host_to_device
from canary_instrument.runtime.perturb.batch import batch_facts


class NextTokenSwap:
    name = "next_token_swap"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        if facts is None or facts.mode not in ("decode", "verify") or facts.size < 2:
            return None
        i = ctx.rng.randrange(facts.size)
        order = [r for r in range(facts.size) if r != i]
        ctx.rng.shuffle(order)
        first = [sum(facts.new[:r]) for r in range(facts.size)]  # each request's first new token in the batch
        ids = forward_batch.input_ids
        rows = host_to_device(order, ids.device)
        tokens = host_to_device([first[r] for r in order], ids.device)
        at_i = first[i]
        token_i = ids[at_i : at_i + 1].clone()
        differs = ids.index_select(0, tokens) != token_i
        # The first differing candidate (argmax finds the first maximum); when none differs, j is a
        # candidate with the same token and the swap below changes nothing.
        pick = differs.to(torch.int8).argmax().reshape(1)
        j, at_j = rows.index_select(0, pick), tokens.index_select(0, pick)
        token_j = ids.index_select(0, at_j)
        ids[at_i : at_i + 1].copy_(token_j)
        ids.index_copy_(0, at_j, token_i)
        rpi, slots = forward_batch.req_pool_indices, forward_batch.out_cache_loc
        device = {
            "req": rpi[i : i + 1].to(torch.int64), "other_req": rpi.index_select(0, j).to(torch.int64),
            "slot": slots[at_i : at_i + 1].to(torch.int64), "other_slot": slots.index_select(0, at_j).to(torch.int64),
            "applied": token_i != token_j, "other_row": j, "token": token_i, "other_token": token_j,
        }
        mapping = ctx.state.swa_mapping
        if mapping is not None:  # the SWA group's rows of both positions carry the wrong token too
            device["swa_slot"] = mapping.index_select(0, device["slot"]).to(torch.int64)
            device["other_swa_slot"] = mapping.index_select(0, device["other_slot"]).to(torch.int64)
        if facts.prefix is None:
            # A target verify whose prefixes only the device holds: both positions are device facts (placed
            # first, so the line's fields keep their host-known order); the partner's row is not logged.
            prefix = facts.device_prefix
            del device["other_row"]
            device = {"position": prefix[i : i + 1], "other_position": prefix.index_select(0, j), **device}
            return Planned(self.name, step, position=-1, device=device)
        # Positions are host facts per row; the partner's row is a device fact, so its position is
        # filled in from ``positions`` when the facts arrive.
        return Planned(self.name, step, position=facts.prefix[i], device=device,
                       derived=(("other_position", "other_row", facts.prefix),))
