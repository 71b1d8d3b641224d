"""``next_token_swap``: two requests of a decode batch exchange their next input tokens.

Models a sampler or scheduler bug that hands a request another request's token. The KV of both
positions is computed from the wrong token and the canary rows written for them carry it, so
the token check (the expected-token table, from ``canary_token_ids``) reports ``token`` at both
positions in that forward's post-forward pass, and again wherever the rows are read later.
Only pairs whose tokens differ are chosen (the host knows them from ``canary_token_ids``), so
every swap changes something. It cannot be undone: the KV has been computed.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.perturb.base import KindContext, Planned
from canary_instrument.runtime.perturb.batch import batch_facts


class NextTokenSwap:
    name = "next_token_swap"
    hook = "before_forward"

    def inject(self, ctx: KindContext, step: int, forward_batch: Any = None, cache: Any = None) -> Optional[Planned]:
        import torch

        facts = batch_facts(forward_batch)
        known = getattr(forward_batch, "canary_token_ids", None)
        if facts is None or facts.mode != "decode" or facts.size < 2 or known is None:
            return None
        tokens = [known[r][facts.prefix[r]] if len(known[r]) > facts.prefix[r] else None for r in range(facts.size)]
        rows = [r for r, t in enumerate(tokens) if t is not None]
        if len(rows) < 2:
            return None
        i = ctx.rng.choice(rows)
        others = [r for r in rows if tokens[r] != tokens[i]]
        if not others:
            return None
        j = ctx.rng.choice(others)
        ids = forward_batch.input_ids
        saved = ids[i : i + 1].clone()
        ids[i : i + 1].copy_(ids[j : j + 1])
        ids[j : j + 1].copy_(saved)
        rpi, slots = forward_batch.req_pool_indices, forward_batch.out_cache_loc
        device = {
            "req": rpi[i : i + 1].to(torch.int64), "other_req": rpi[j : j + 1].to(torch.int64),
            "slot": slots[i : i + 1].to(torch.int64), "other_slot": slots[j : j + 1].to(torch.int64),
            "applied": saved != ids[i : i + 1],
        }
        mapping = ctx.state.swa_mapping
        if mapping is not None:  # the SWA group's rows of both positions carry the wrong token too
            device["swa_slot"] = mapping.index_select(0, device["slot"]).to(torch.int64)
            device["other_swa_slot"] = mapping.index_select(0, device["other_slot"]).to(torch.int64)
        return Planned(
            self.name, step, position=facts.prefix[i],
            extra=(("other_position", facts.prefix[j]), ("token", tokens[i]), ("other_token", tokens[j])),
            device=device,
        )
