"""The reference's shared pieces: the batch a plan describes, the slot each (request, position) resolves to,
the chain link a position derives from its predecessor, fingerprints, and ring records."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import hashing, layers
from ..state import GROUP_SWA, CanaryGroup, CanaryState, PlanInputs

PARTIAL_WORDS = 2  # 16 bytes of layer 0's row


@dataclass
class Batch:
    num_reqs: int  # live (non-padding) requests
    req_pool: torch.Tensor  # int64 [n]
    prefix: torch.Tensor  # int64 [n]
    extend: torch.Tensor  # int64 [n]
    token_base: torch.Tensor  # int64 [n]: first input id of each request (padding rows counted)
    check_sampled: bool
    target_margin: int
    target_window: int
    prefix_links: bool
    identity: int
    out_cache_loc: torch.Tensor | None


@dataclass
class Slots:
    full_raw: torch.Tensor  # req_to_token value
    mapped_raw: torch.Tensor  # swa_mapping value (SWA group) else full slot
    full_ok: torch.Tensor
    map_ok: torch.Tensor
    slot: torch.Tensor  # row index into the group's rows; 0 when unresolvable

    @property
    def ok(self) -> torch.Tensor:
        return self.full_ok & self.map_ok


def fingerprint_words(state: CanaryState, group: CanaryGroup) -> int:
    """How many leading int64 words of a real-KV row the fingerprint covers (0 = none)."""
    if state.realkv == "none" or group.kv_words is None:
        return 0
    if state.realkv == "partial":
        return min(PARTIAL_WORDS, group.kv_words.shape[1])
    return group.kv_words.shape[1]


def checked_layers(state: CanaryState, group: CanaryGroup, req_pool: torch.Tensor) -> torch.Tensor | None:
    """Per entry, the one layer a pre-forward pass fingerprints with realkv=partial (the request's cursor modulo
    the group's layers); None with realkv=all, where every layer is checked."""
    if state.realkv == "all":
        return None
    return layers.cursor_table(state)[req_pool] % layers.layer_count(group)


def check_fingerprints(group: CanaryGroup, nwords: int, slot: torch.Tensor, ok: torch.Tensor,
                       checked: torch.Tensor | None):
    """(bad, unwritten, stored, recomputed) over the layers ``checked`` names per entry (None: all layers):
    bad where a stored fingerprint differs from the KV's, unwritten where it is 0; stored/recomputed of the
    lowest failing layer."""
    zero = torch.zeros_like(slot)
    bad = unwritten = torch.zeros_like(ok)
    stored_out, recomputed_out = zero, zero
    for layer in reversed(range(layers.layer_count(group))):
        due = ok if checked is None else ok & (checked == layer)
        stored = layers.stored_fingerprint(group, slot, layer)
        recomputed = hashing.fingerprint(layers.layer_words(group, layer)[slot, :nwords])
        bad_here = due & (stored != 0) & (stored != recomputed)
        bad = bad | bad_here
        unwritten = unwritten | (due & (stored == 0))
        stored_out = torch.where(bad_here, stored, stored_out)
        recomputed_out = torch.where(bad_here, recomputed, recomputed_out)
    return bad, unwritten, stored_out, recomputed_out


def batch_of(plan: PlanInputs) -> Batch:
    n = int(plan.num_reqs)
    req_pool = plan.req_pool_indices[:n].long()
    if plan.extend_const > 0:
        extend = torch.full_like(req_pool, plan.extend_const)
    else:
        extend = plan.extend_lens[:n].long()
    prefix = plan.prefix_lens[:n].long() - (extend if plan.prefix_is_end else 0)
    token_base = torch.cumsum(extend, 0) - extend
    live = (req_pool != 0) & (prefix >= plan.min_prefix)
    if plan.pad_mark is not None:
        live = live & (plan.pad_mark[:n].long() >= 0)
    return Batch(
        num_reqs=int(live.sum()),
        req_pool=req_pool[live],
        prefix=prefix[live],
        extend=extend[live],
        token_base=token_base[live],
        check_sampled=plan.check_sampled,
        target_margin=plan.target_margin,
        target_window=plan.target_window,
        prefix_links=plan.prefix_links,
        identity=plan.identity,
        out_cache_loc=plan.out_cache_loc,
    )


def items(starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, position) of every position in [starts[r], ends[r]), request-major."""
    lens = (ends - starts).clamp(min=0)
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)
    first = torch.cumsum(lens, 0) - lens
    pos = starts[req] + torch.arange(req.shape[0], device=lens.device) - first[req]
    return req, pos


def resolve(state: CanaryState, group: CanaryGroup, req_pool: torch.Tensor, pos: torch.Tensor) -> Slots:
    full_rows = state.groups[0].rows.shape[0]
    full_raw = state.req_to_token[req_pool, pos].long()
    full_ok = (full_raw > 0) & (full_raw < full_rows)
    full_slot = torch.where(full_ok, full_raw, 0)
    if group.group != GROUP_SWA:
        return Slots(full_raw, full_raw, full_ok, torch.ones_like(full_ok), full_slot)
    mapped_raw = state.swa_mapping[full_slot].long()
    map_ok = (mapped_raw > 0) & (mapped_raw < group.rows.shape[0])
    slot = torch.where(full_ok & map_ok, mapped_raw, 0)
    return Slots(full_raw, mapped_raw, full_ok, map_ok, slot)


def seed_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, hashing.as_signed(hashing.CHAIN_SEED))


def incoming_link(state, group, req_pool, pos) -> torch.Tensor:
    """S_p derived from the stored row of position p - 1 (S_0 at p == 0)."""
    pred = resolve(state, group, req_pool, (pos - 1).clamp(min=0))
    row = group.rows[pred.slot]
    derived = hashing.next_link(row[:, 0], row[:, 1], row[:, 2])
    return torch.where(pos > 0, derived, seed_like(derived))


def ring_records(kernel_id, group, req_pool, pos, slots, reasons, stored, expected, landed=None) -> torch.Tensor:
    """One record a failing entry; ``landed``: (mask, slot) of entries reported at the next position's slot."""
    record_slot = torch.where(slots.full_ok & ~slots.map_ok, slots.full_raw, slots.slot)
    record_slot = torch.where(slots.full_ok, record_slot, slots.full_raw)
    if landed is not None:
        at_next, slot = landed
        record_slot = torch.where(at_next, slot, record_slot)
        pos = torch.where(at_next, pos + 1, pos)
    cols = [
        torch.full_like(pos, kernel_id),
        torch.full_like(pos, group.group * 2 + group.half),
        record_slot,
        pos,
        stored,
        expected,
        reasons,
        req_pool,
    ]
    bad = reasons != 0
    return torch.stack([c[bad] for c in cols], dim=1)


def window_lo(state: CanaryState, batch: Batch) -> torch.Tensor:
    return (batch.prefix - state.swa_window).clamp(min=0)


def reason_bits(*flags: tuple) -> torch.Tensor:
    """Each entry's reason word: the bit of every ``(bad, bit)`` pair whose ``bad`` is set there."""
    bad, bit = flags[0]
    word = bad.long() * bit
    for bad, bit in flags[1:]:
        word = word + bad.long() * bit
    return word
