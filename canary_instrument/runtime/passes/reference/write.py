"""The reference's writes: the new positions' rows (the chain scanned per request), the sampled tokens
filed under their rows, and each request's identity entry."""

from __future__ import annotations

import torch

from .. import hashing
from ..state import IDENTITY_FIRST_NEW, KERNEL_PRE, PADDING_SLOT, SWA_UNMAPPED, CanaryGroup, CanaryState, PlanInputs
from .slots import Batch, incoming_link, ring_records, resolve


def write_new_rows(state: CanaryState, group: CanaryGroup, batch: Batch, input_ids: torch.Tensor,
                    req: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rows (token, position, S_p, 0) of the new positions, the chain scanned per request."""
    req_pool = batch.req_pool[req]
    # Tokens are 32-bit: the row holds what the chain keys, so any bit above them is a corruption (ROW_BITS).
    tokens = input_ids.reshape(-1)[batch.token_base[req] + pos - batch.prefix[req]].long() & 0xFFFFFFFF

    a, b = hashing.affine(tokens, pos)
    # Exclusive per-request prefix: item j gets the maps of its request's items before it.
    first = torch.ones_like(req, dtype=torch.bool)
    first[1:] = req[1:] != req[:-1]
    a_shift = torch.where(first, 1, torch.roll(a, 1))
    b_shift = torch.where(first, 0, torch.roll(b, 1))
    a_scan, b_scan = segmented_scan(a_shift, b_shift, req)
    start_pos = batch.prefix[req]
    incoming = incoming_link(state, group, req_pool, start_pos)
    links = a_scan * incoming + b_scan

    slots = resolve(state, group, req_pool, pos)
    ok = slots.ok
    rows = torch.stack([tokens, pos, links, torch.zeros_like(pos)], dim=1)
    group.rows[slots.slot[ok]] = rows[ok]

    zero = torch.zeros_like(pos)
    reasons = (slots.full_ok & ~slots.map_ok).long() * SWA_UNMAPPED + (~slots.full_ok).long() * PADDING_SLOT
    stored = torch.where(slots.full_ok, slots.mapped_raw, slots.full_raw)
    records = ring_records(KERNEL_PRE, group, req_pool, pos, slots, reasons, stored, zero)
    return records, int(ok.sum())


def segmented_scan(a: torch.Tensor, b: torch.Tensor, seg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive affine scan that never composes across segment (request) boundaries."""
    a, b = a.clone(), b.clone()
    n = a.shape[0]
    step = 1
    while step < n:
        same = seg[step:] == seg[:-step]
        a_new = torch.where(same, a[step:] * a[:-step], a[step:])
        b_new = torch.where(same, a[step:] * b[:-step] + b[step:], b[step:])
        a = torch.cat([a[:step], a_new])
        b = torch.cat([b[:step], b_new])
        step *= 2
    return a, b


def file_samples(state: CanaryState, plan: PlanInputs) -> None:
    """The last sample (staging, in its forward's batch order) into the table under that forward's rows;
    staging cleared; this forward's rows (graph padding included) and their count left in their place."""
    cap = state.sample_staging.shape[0]
    rows = state.sample_rows
    before = int(rows[cap])
    prev = rows[:before]
    live = prev > 0
    state.sampled_tokens[prev[live]] = state.sample_staging[:before][live]
    state.sample_staging[:before] = -1
    n = min(int(plan.num_reqs), cap)
    rows[:n] = plan.req_pool_indices[:n].long()
    rows[cap] = n


def record_identity(state: CanaryState, batch: Batch) -> None:
    """Post-forward: each request's identity entry becomes (position, token, link) of the FULL K row at the
    position its forward keeps (the last new one; a target verify's first), read back as written; an
    unresolvable slot there leaves no entry (-1)."""
    if state.identity is None or batch.identity == 0:
        return
    has_new = batch.extend > 0
    if not bool(has_new.any()):
        return
    req_pool = batch.req_pool[has_new]
    prefix, extend = batch.prefix[has_new], batch.extend[has_new]
    at = prefix if batch.identity == IDENTITY_FIRST_NEW else prefix + extend - 1
    slots = resolve(state, state.groups[0], req_pool, at)
    row = state.groups[0].rows[slots.slot]
    entry = torch.stack([at, row[:, 0], row[:, 2]], dim=1)
    state.identity[req_pool] = torch.where(slots.ok[:, None], entry, torch.full_like(entry, -1))
