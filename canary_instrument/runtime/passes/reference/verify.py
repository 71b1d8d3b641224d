"""The reference's verify pass over one group/half: the reasons of each (request, position) entry and
their ring records (module docstring of ``reference``: the rules)."""

from __future__ import annotations

import torch

from ..state import (
    FINGERPRINT,
    FREED,
    FREED_POSITION,
    IDENTITY,
    KERNEL_POST,
    KERNEL_PRE,
    LINK,
    PADDING_SLOT,
    POSITION,
    ROW_BITS,
    SWA_UNMAPPED,
    TOKEN,
    UNWRITTEN,
    WRITE_SLOT,
    GROUP_SWA,
    CanaryGroup,
    CanaryState,
)
from .slots import (Batch, Slots, check_fingerprints, checked_layers, fingerprint_words, incoming_link,
                    reason_bits, resolve, ring_records)


def expected_tokens(state: CanaryState, kernel_id: int, batch: Batch, req: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor:
    """The token each entry must hold (-1 = not checked); see the module docstring."""
    none = torch.full_like(pos, -1)
    req_pool = batch.req_pool[req]
    if kernel_id == KERNEL_POST and state.sampled_tokens is not None and batch.check_sampled:
        sampled = state.sampled_tokens[req_pool].long()
        return torch.where(pos == batch.prefix[req], sampled, none)
    if kernel_id == KERNEL_PRE and state.target_rows is not None and batch.target_margin >= 0:
        end = batch.prefix[req] - batch.target_margin
        due = pos < end
        if batch.target_window > 0:
            due = due & (pos >= end - batch.target_window)
        col = (pos + 1).clamp(max=state.req_to_token.shape[1] - 1)
        raw = state.req_to_token[req_pool, col].long()
        ok = due & (raw > 0) & (raw < state.target_rows.shape[0])
        return torch.where(ok, state.target_rows[torch.where(ok, raw, 0), 0], none)
    return none


def verify(state: CanaryState, group: CanaryGroup, kernel_id: int, batch: Batch, req: torch.Tensor,
            pos: torch.Tensor, window_lo: torch.Tensor) -> tuple[torch.Tensor, Slots]:
    """Reasons for each (request, position) entry of one group/half; returns records and slots."""
    req_pool = batch.req_pool[req]
    slots = resolve(state, group, req_pool, pos)
    ok = slots.ok
    row = group.rows[slots.slot]
    zero = torch.zeros_like(pos)

    bad_pos = ok & (row[:, 1] != pos)
    expected_link = incoming_link(state, group, req_pool, pos)
    lo = window_lo[req]
    check_link = ~((pos == lo) & (lo > 0)) if group.group == GROUP_SWA else torch.ones_like(ok)
    if kernel_id == KERNEL_PRE and not batch.prefix_links:
        check_link = torch.zeros_like(ok)
    bad_link = ok & check_link & (row[:, 2] != expected_link)

    nwords = fingerprint_words(state, group)
    bad_fp = unwritten_fp = torch.zeros_like(ok)
    fp_stored = recomputed = zero
    if nwords and kernel_id == KERNEL_PRE:
        # Post-forward rows were written by this forward's pre-forward pass: their fingerprints are due after it.
        checked = checked_layers(state, group, req_pool)
        bad_fp, unwritten_fp, fp_stored, recomputed = check_fingerprints(group, nwords, slots.slot, ok, checked)
        unwritten_fp = unwritten_fp | (ok & (row[:, 3] == 0))

    expected_token = expected_tokens(state, kernel_id, batch, req, pos)
    bad_token = ok & (expected_token >= 0) & (row[:, 0] != expected_token)

    bad_pad = ~slots.full_ok
    bad_map = slots.full_ok & ~slots.map_ok
    unwritten = unwritten_fp | (ok & (row[:, 2] == 0))
    row_bits = ok & ((row[:, 0] >> 32) != 0)
    reasons = reason_bits((bad_pos, POSITION), (bad_link, LINK), (bad_fp, FINGERPRINT), (bad_token, TOKEN),
                          (bad_map, SWA_UNMAPPED), (bad_pad, PADDING_SLOT), (unwritten, UNWRITTEN),
                          (row_bits, ROW_BITS))
    # Request identity, write side, freed slots: docs/architecture.md, "Request identity and the write side".
    identity_bits, id_stored, id_expected = identity_and_write_side(
        state, group, kernel_id, batch, req, pos, slots, row)
    freed = ok & (row[:, 1] == FREED_POSITION)
    reasons = torch.where(freed, (reasons & ~POSITION) | FREED, reasons) | identity_bits
    # stored/expected of the first failing field in reason-bit order: apply from last to first.
    stored, expected = id_stored, id_expected
    for bad, s, e in (
        (row_bits, row[:, 0], row[:, 0] & 0xFFFFFFFF),
        (unwritten, zero, zero),
        (bad_pad, slots.full_raw, zero),
        (bad_map, slots.mapped_raw, zero),
        (bad_token, row[:, 0], expected_token),
        (bad_fp, fp_stored, recomputed),
        (bad_link, row[:, 2], expected_link),
        (bad_pos, row[:, 1], pos),
    ):
        stored = torch.where(bad, s, stored)
        expected = torch.where(bad, e, expected)
    landed = None
    if kernel_id == KERNEL_PRE and state.target_rows is not None and group.group != GROUP_SWA:
        # A draft row whose only fault is its token disagreeing with the target's row of the next position is
        # reported where a corrupted verify input lands: the target's slot and position, the target's token as
        # stored, the draft's as expected (as the kernel does).
        at_target = reasons == TOKEN
        col = (pos + 1).clamp(max=state.req_to_token.shape[1] - 1)
        landed = (at_target, state.req_to_token[req_pool, col].long())
        stored, expected = torch.where(at_target, expected, stored), torch.where(at_target, stored, expected)
    return ring_records(kernel_id, group, req_pool, pos, slots, reasons, stored, expected, landed), slots


def identity_and_write_side(state: CanaryState, group: CanaryGroup, kernel_id: int, batch: Batch,
                             req: torch.Tensor, pos: torch.Tensor, slots: Slots, row: torch.Tensor):
    """IDENTITY (pre-forward: the row at the position the request's identity entry names must hold the token
    and link its last forward left there) and WRITE_SLOT (post-forward: each new position's slot in
    req_to_token must be the slot the forward wrote, out_cache_loc), on the FULL group's K half only.
    Returns (bits, stored, expected) with stored/expected of the first of them that fails."""
    zero = torch.zeros_like(pos)
    bits = zero.clone()
    stored, expected = zero.clone(), zero.clone()
    if group.group != 0 or group.half != 0:
        return bits, stored, expected
    req_pool = batch.req_pool[req]
    if kernel_id == KERNEL_PRE and state.identity is not None and batch.identity != 0:
        entry = state.identity[req_pool]
        due = slots.ok & (entry[:, 0] >= 0) & (pos == entry[:, 0])
        bad_link = row[:, 2] != entry[:, 2]
        bad = due & (bad_link | (row[:, 0] != entry[:, 1]))
        bits = bits | bad.long() * IDENTITY
        stored = torch.where(bad, torch.where(bad_link, row[:, 2], row[:, 0]), stored)
        expected = torch.where(bad, torch.where(bad_link, entry[:, 2], entry[:, 1]), expected)
    if kernel_id == KERNEL_POST and batch.out_cache_loc is not None:
        written = batch.out_cache_loc.reshape(-1)[batch.token_base[req] + pos - batch.prefix[req]].long()
        bad = written != slots.full_raw
        bits = bits | bad.long() * WRITE_SLOT
        stored = torch.where(bad, written, stored)
        expected = torch.where(bad, slots.full_raw, expected)
    return bits, stored, expected
