"""Byte-exact torch reference of the pre- and post-forward canary kernels.

It defines what the Triton kernels must do, row for row and record for record (records are
compared as a multiset: the kernels append them in whatever order their programs finish).
It reads the batch sizes on the host, so it is for tests, benchmarks and CPU runs, not for
use inside a CUDA graph.

Semantics beyond docs/architecture.md, shared by both backends:
- A slot outside ``(0, full_slots)`` in a real request's range is a PADDING_SLOT entry
  (stored = the slot value, expected = 0): its row is never read or written.
- SWA group: the slot is ``swa_mapping[full_slot]``; a value outside ``(0, swa_slots)`` is
  SWA_UNMAPPED (record slot = the full slot, stored = the mapping value, expected = 0).
  Pre-forward verifies positions ``[max(0, prefix - W), prefix)``; the link check is skipped
  at the window's first position when it is > 0 (its predecessor may be evicted).
- The written link of the first new position is derived from the stored row of position
  ``prefix - 1`` of the same group and half (S_0 when prefix == 0); a broken predecessor
  therefore propagates and is reported again on the next pass.
- Post-forward writes fingerprints of every resolvable new slot, whatever its verdict.
- The ring keeps record ``i`` at ``i % RING``. The reference writes records in request order; the
  kernels in completion order, so when one pass overflows the ring, which record (and, as lanes
  race on a slot, which fields) survives in a slot is unspecified. ``ring_count`` stays exact.
- Counters: [0] pre runs, [1] post runs, [2] entries verified (per group and half, including
  failing ones), [3] rows written by pre-forward; group_verified[g] sums group g's halves.
- The plan comes from the batch (``PlanInputs``): rows ``r < num_reqs`` whose req-pool index is
  0 are graph padding and skipped, but their tokens still occupy ``input_ids``.
- Sampled tokens reach ``sampled_tokens`` through ``sample_staging``: every pre-forward pass first
  files the staging entries of the last forward's batch under that forward's rows
  (``sample_rows``), clears them, and leaves its own rows (graph padding rows included).
- Expected tokens: with ``sampled_tokens`` (target), the post-forward pass of a decode
  (``check_sampled``) compares the row at each request's first new position with its row's
  entry (>= 0), and every post-forward pass then clears the entries of its requests that wrote
  anything. With
  ``target_rows`` (draft worker), the pre-forward pass compares each position
  ``p < prefix - target_margin`` with the token of the target's row of position ``p + 1``
  (slot ``req_to_token[r, p + 1]`` inside ``(0, target slots)``).
- Request side (FULL group, K half; docs/kernels.md, "Request identity, the write side and freed
  slots"): with ``identity`` and a plan whose ``identity`` is on, the pre-forward pass reports IDENTITY
  where the position equals the request's entry and the row's link or token differs from it (stored/
  expected: the link, else the token), and the post-forward pass records each request's entry at
  the position it keeps, from the row as read back (-1 where the slot there is unresolvable). With
  ``out_cache_loc`` the post-forward pass reports WRITE_SLOT where a new position's written slot
  differs from its ``req_to_token`` entry (stored: the written slot, expected: the entry). IDENTITY
  and WRITE_SLOT give stored/expected only when no other reason of the entry does.
- A row whose position is ``FREED_POSITION`` is reported FREED instead of POSITION, in every group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import hashing, layers
from .state import (
    FINGERPRINT,
    FREED,
    FREED_POSITION,
    IDENTITY,
    IDENTITY_FIRST_NEW,
    WRITE_SLOT,
    GROUP_FULL,
    GROUP_SWA,
    KERNEL_POST,
    KERNEL_PRE,
    LINK,
    PADDING_SLOT,
    POSITION,
    ROW_BITS,
    SWA_UNMAPPED,
    TOKEN,
    UNWRITTEN,
    CanaryGroup,
    CanaryState,
    PlanInputs,
)

PARTIAL_WORDS = 2  # 16 bytes of layer 0's row


@dataclass
class _Batch:
    num_reqs: int  # live (non-padding) requests
    req_pool: torch.Tensor  # int64 [n]
    prefix: torch.Tensor  # int64 [n]
    extend: torch.Tensor  # int64 [n]
    token_base: torch.Tensor  # int64 [n]: first input id of each request (padding rows counted)
    check_sampled: bool
    target_margin: int
    identity: int
    out_cache_loc: torch.Tensor | None


@dataclass
class _Slots:
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


def _batch(plan: PlanInputs) -> _Batch:
    n = int(plan.num_reqs)
    req_pool = plan.req_pool_indices[:n].long()
    if plan.extend_const > 0:
        extend = torch.full_like(req_pool, plan.extend_const)
    else:
        extend = plan.extend_lens[:n].long()
    prefix = plan.prefix_lens[:n].long() - (extend if plan.prefix_is_end else 0)
    token_base = torch.cumsum(extend, 0) - extend
    live = req_pool != 0
    return _Batch(
        num_reqs=int(live.sum()),
        req_pool=req_pool[live],
        prefix=prefix[live],
        extend=extend[live],
        token_base=token_base[live],
        check_sampled=plan.check_sampled,
        target_margin=plan.target_margin,
        identity=plan.identity,
        out_cache_loc=plan.out_cache_loc,
    )


def _items(starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, position) of every position in [starts[r], ends[r]), request-major."""
    lens = (ends - starts).clamp(min=0)
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)
    first = torch.cumsum(lens, 0) - lens
    pos = starts[req] + torch.arange(req.shape[0], device=lens.device) - first[req]
    return req, pos


def _resolve(state: CanaryState, group: CanaryGroup, req_pool: torch.Tensor, pos: torch.Tensor) -> _Slots:
    full_rows = state.groups[0].rows.shape[0]
    full_raw = state.req_to_token[req_pool, pos].long()
    full_ok = (full_raw > 0) & (full_raw < full_rows)
    full_slot = torch.where(full_ok, full_raw, 0)
    if group.group != GROUP_SWA:
        return _Slots(full_raw, full_raw, full_ok, torch.ones_like(full_ok), full_slot)
    mapped_raw = state.swa_mapping[full_slot].long()
    map_ok = (mapped_raw > 0) & (mapped_raw < group.rows.shape[0])
    slot = torch.where(full_ok & map_ok, mapped_raw, 0)
    return _Slots(full_raw, mapped_raw, full_ok, map_ok, slot)


def _seed_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, hashing.as_signed(hashing.CHAIN_SEED))


def _incoming_link(state, group, req_pool, pos) -> torch.Tensor:
    """S_p derived from the stored row of position p - 1 (S_0 at p == 0)."""
    pred = _resolve(state, group, req_pool, (pos - 1).clamp(min=0))
    row = group.rows[pred.slot]
    derived = hashing.next_link(row[:, 0], row[:, 1], row[:, 2])
    return torch.where(pos > 0, derived, _seed_like(derived))


def _records(kernel_id, group, req_pool, pos, slots, reasons, stored, expected) -> torch.Tensor:
    record_slot = torch.where(slots.full_ok & ~slots.map_ok, slots.full_raw, slots.slot)
    record_slot = torch.where(slots.full_ok, record_slot, slots.full_raw)
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


def _expected_tokens(state: CanaryState, kernel_id: int, batch: _Batch, req: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor:
    """The token each entry must hold (-1 = not checked); see the module docstring."""
    none = torch.full_like(pos, -1)
    req_pool = batch.req_pool[req]
    if kernel_id == KERNEL_POST and state.sampled_tokens is not None and batch.check_sampled:
        sampled = state.sampled_tokens[req_pool].long()
        return torch.where(pos == batch.prefix[req], sampled, none)
    if kernel_id == KERNEL_PRE and state.target_rows is not None:
        due = pos < batch.prefix[req] - batch.target_margin
        col = (pos + 1).clamp(max=state.req_to_token.shape[1] - 1)
        raw = state.req_to_token[req_pool, col].long()
        ok = due & (raw > 0) & (raw < state.target_rows.shape[0])
        return torch.where(ok, state.target_rows[torch.where(ok, raw, 0), 0], none)
    return none


def _verify(state: CanaryState, group: CanaryGroup, kernel_id: int, batch: _Batch, req: torch.Tensor,
            pos: torch.Tensor, window_lo: torch.Tensor) -> tuple[torch.Tensor, _Slots]:
    """Reasons for each (request, position) entry of one group/half; returns records and slots."""
    req_pool = batch.req_pool[req]
    slots = _resolve(state, group, req_pool, pos)
    ok = slots.ok
    row = group.rows[slots.slot]
    zero = torch.zeros_like(pos)

    bad_pos = ok & (row[:, 1] != pos)
    expected_link = _incoming_link(state, group, req_pool, pos)
    lo = window_lo[req]
    check_link = ~((pos == lo) & (lo > 0)) if group.group == GROUP_SWA else torch.ones_like(ok)
    bad_link = ok & check_link & (row[:, 2] != expected_link)

    nwords = fingerprint_words(state, group)
    bad_fp = unwritten_fp = torch.zeros_like(ok)
    fp_stored = recomputed = zero
    if nwords and kernel_id == KERNEL_PRE:
        # Post-forward rows were written by this forward's pre-forward pass: their fingerprints are due after it.
        checked = checked_layers(state, group, req_pool)
        bad_fp, unwritten_fp, fp_stored, recomputed = check_fingerprints(group, nwords, slots.slot, ok, checked)
        unwritten_fp = unwritten_fp | (ok & (row[:, 3] == 0))

    expected_token = _expected_tokens(state, kernel_id, batch, req, pos)
    bad_token = ok & (expected_token >= 0) & (row[:, 0] != expected_token)

    bad_pad = ~slots.full_ok
    bad_map = slots.full_ok & ~slots.map_ok
    unwritten = unwritten_fp | (ok & (row[:, 2] == 0))
    row_bits = ok & ((row[:, 0] >> 32) != 0)
    reasons = (
        bad_pos.long() * POSITION
        + bad_link.long() * LINK
        + bad_fp.long() * FINGERPRINT
        + bad_token.long() * TOKEN
        + bad_map.long() * SWA_UNMAPPED
        + bad_pad.long() * PADDING_SLOT
        + unwritten.long() * UNWRITTEN
        + row_bits.long() * ROW_BITS
    )
    # Request identity, write side, freed slots: docs/architecture.md, "Request identity and the write side".
    identity_bits, id_stored, id_expected = _identity_and_write_side(
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
    return _records(kernel_id, group, req_pool, pos, slots, reasons, stored, expected), slots


def _identity_and_write_side(state: CanaryState, group: CanaryGroup, kernel_id: int, batch: _Batch,
                             req: torch.Tensor, pos: torch.Tensor, slots: _Slots, row: torch.Tensor):
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


def _record_identity(state: CanaryState, batch: _Batch) -> None:
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
    slots = _resolve(state, state.groups[0], req_pool, at)
    row = state.groups[0].rows[slots.slot]
    entry = torch.stack([at, row[:, 0], row[:, 2]], dim=1)
    state.identity[req_pool] = torch.where(slots.ok[:, None], entry, torch.full_like(entry, -1))


def _append(state: CanaryState, records: list[torch.Tensor]) -> None:
    if state.ring_count is None or not records:
        return
    recs = torch.cat(records)
    m = recs.shape[0]
    if m == 0:
        return
    if state.ring is not None:
        ring_size = state.ring.shape[0]
        idx = (int(state.ring_count[0]) + torch.arange(m, device=recs.device)) % ring_size
        state.ring[idx[-ring_size:]] = recs[-ring_size:].to(state.ring.device)
    state.ring_count += m


def _count(state: CanaryState, run_index: int, verified: dict[int, int], written: int) -> None:
    if state.counters is not None:
        state.counters[run_index] += 1
        state.counters[2] += sum(verified.values())
        state.counters[3] += written
    if state.group_verified is not None:
        for g, n in verified.items():
            state.group_verified[g] += n


def _publish(state: CanaryState) -> None:
    """The post-forward pass's last act (the kernels' ``publish``): mirror ``status`` into ``published``,
    then the packed word ``ring_count & 0xFFFFFFFF | post_runs << 32`` into slot n + post_runs % slots."""
    if state.status is None or state.published is None or state.publish_done is None:
        return
    n = state.status.shape[0]
    pinned = state.published.is_pinned()
    packed = (state.ring_count[:1] & 0xFFFFFFFF) | (state.counters[1:2] << 32)
    state.published[:n].copy_(state.status, non_blocking=pinned)
    slot = n + int(state.counters[1]) % (state.published.shape[0] - n)
    state.published[slot : slot + 1].copy_(packed, non_blocking=pinned)


def _window_lo(state: CanaryState, batch: _Batch) -> torch.Tensor:
    return (batch.prefix - state.swa_window).clamp(min=0)


def _write_new_rows(state: CanaryState, group: CanaryGroup, batch: _Batch, input_ids: torch.Tensor,
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
    a_scan, b_scan = _segmented_scan(a_shift, b_shift, req)
    start_pos = batch.prefix[req]
    incoming = _incoming_link(state, group, req_pool, start_pos)
    links = a_scan * incoming + b_scan

    slots = _resolve(state, group, req_pool, pos)
    ok = slots.ok
    rows = torch.stack([tokens, pos, links, torch.zeros_like(pos)], dim=1)
    group.rows[slots.slot[ok]] = rows[ok]

    zero = torch.zeros_like(pos)
    reasons = (slots.full_ok & ~slots.map_ok).long() * SWA_UNMAPPED + (~slots.full_ok).long() * PADDING_SLOT
    stored = torch.where(slots.full_ok, slots.mapped_raw, slots.full_raw)
    records = _records(KERNEL_PRE, group, req_pool, pos, slots, reasons, stored, zero)
    return records, int(ok.sum())


def _segmented_scan(a: torch.Tensor, b: torch.Tensor, seg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def _file_samples(state: CanaryState, plan: PlanInputs) -> None:
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


def mark_freed_buffer(state: CanaryState) -> None:
    """Mark the FULL rows of the slots in ``state.freed`` freed (entries out of [1, rows) dropped), then empty it."""
    entries = state.freed[state.freed != 0]
    if entries.numel():
        for group in state.groups:
            if group.group == GROUP_FULL:
                slots = entries[(entries > 0) & (entries < group.rows.shape[0])]
                group.rows[slots, 1] = FREED_POSITION
        state.freed.zero_()


def pre_forward(state: CanaryState, plan: PlanInputs, input_ids: torch.Tensor) -> None:
    """File the last sample (targets with a sampler), verify every request's prefix in every group/half,
    then write the rows of its new tokens."""
    if state.freed is not None:
        mark_freed_buffer(state)
    if int(plan.enabled[0]) == 0:
        return
    if state.sample_staging is not None:
        _file_samples(state, plan)
    batch = _batch(plan)
    lo = _window_lo(state, batch)
    records, verified, written = [], {}, 0
    for group in state.groups:
        start = lo if group.group == GROUP_SWA else torch.zeros_like(batch.prefix)
        req, pos = _items(start, batch.prefix)
        recs, _ = _verify(state, group, KERNEL_PRE, batch, req, pos, lo)
        records.append(recs)
        verified[group.group] = verified.get(group.group, 0) + pos.shape[0]
    for group in state.groups:
        req, pos = _items(batch.prefix, batch.prefix + batch.extend)
        recs, n_written = _write_new_rows(state, group, batch, input_ids, req, pos)
        records.append(recs)
        written += n_written
    _append(state, records)
    _count(state, 0, verified, written)


def post_forward(state: CanaryState, plan: PlanInputs) -> None:
    """Verify the rows written this forward, then store their real-KV fingerprints; publish the status."""
    if int(plan.enabled[0]) == 0:
        _publish(state)
        return
    batch = _batch(plan)
    lo = _window_lo(state, batch)
    records, verified = [], {}
    for group in state.groups:
        req, pos = _items(batch.prefix, batch.prefix + batch.extend)
        recs, slots = _verify(state, group, KERNEL_POST, batch, req, pos, lo)
        records.append(recs)
        verified[group.group] = verified.get(group.group, 0) + pos.shape[0]
        nwords = fingerprint_words(state, group)
        if nwords:
            target = slots.slot[slots.ok]
            for layer in range(layers.layer_count(group)):
                fp = hashing.fingerprint(layers.layer_words(group, layer)[target, :nwords])
                layers.store_fingerprint(group, target, layer, fp)
    if state.realkv == "partial":
        # The next pre-forward pass of each request that wrote fingerprints the next layer.
        layers.cursor_table(state)[batch.req_pool[batch.extend > 0]] += 1
    _record_identity(state, batch)
    if state.sampled_tokens is not None:
        # Consumed: an entry is only ever checked by the forward right after the sample that wrote it.
        state.sampled_tokens[batch.req_pool[batch.extend > 0]] = -1
    _append(state, records)
    _count(state, 1, verified, 0)
    _publish(state)


class TorchCanaryOps:
    """The reference backend behind ``get_ops(..., backend="torch")``."""

    name = "torch"

    def pre_forward(self, state: CanaryState, plan: PlanInputs, input_ids: torch.Tensor) -> None:
        pre_forward(state, plan, input_ids)

    def post_forward(self, state: CanaryState, plan: PlanInputs) -> None:
        post_forward(state, plan)

    def mark_freed(self, state: CanaryState) -> None:
        mark_freed_buffer(state)
