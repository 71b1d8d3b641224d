"""Byte-exact torch reference of the idle-cache sweep kernel (templates/sweep.py.jinja).

It defines what the Triton kernel must do, counter for counter and record for record (records
compared as a multiset). It reads the row count on the host, so it is for tests, benchmarks and
CPU runs, not for use inside a CUDA graph.

Semantics, per sweep row (slot, position, prev_slot) and per (group, half):
- A slot outside ``(0, full_slots)`` is PADDING_SLOT in every group (stored = the slot).
- SWA group: the row is ``swa_mapping[slot]``; 0 means out of the window, and the row is skipped
  (not verified, not counted). A value outside ``[0, swa_slots)`` is SWA_UNMAPPED (record slot =
  the full slot, stored = the mapping value).
- POSITION: the row's position differs from the walked position (FREED instead where it reads as freed:
  the cache holds a slot the allocator freed).
- LINK: position 0 must hold the chain seed; position p > 0 must hold the link derived from the
  predecessor's row, checked only where the predecessor is known (``0 < prev_slot < full_slots``,
  and in the SWA group mapped to a valid SWA row).
- FINGERPRINT: a stored fingerprint (non-zero) differs from the one recomputed from its layer's KV, for every
  layer the row's fingerprints describe (layer 0 in the row, layers 1.. in the group's table).
- UNWRITTEN: a zero link, or a zero fingerprint of any layer (realkv partial or all): a cached row is complete.
- ROW_BITS: the token word has bits above 32 set.
- Records: ``(KERNEL_SWEEP, group * 2 + half, slot, position, stored, expected, reasons, -1)``, the
  stored/expected pair of the first failing field in reason-bit order.
- Sweep counters (int64[3]): [0] sweep launches, [1] rows swept, [2] entries verified (rows per
  group and half that were checked, failing ones included).
"""

from __future__ import annotations

import torch

from ...codegen.specs import PARTIAL_WORDS
from ..passes import hashing
from ..passes.reference import check_fingerprints
from ..passes.reference.slots import reason_bits
from ..passes.state import (
    FINGERPRINT,
    FREED,
    FREED_POSITION,
    GROUP_SWA,
    KERNEL_SWEEP,
    LINK,
    PADDING_SLOT,
    POSITION,
    ROW_BITS,
    SWA_UNMAPPED,
    UNWRITTEN,
    CanaryState,
)
from .sweep_buffers import SweepBuffers


def sweep(state: CanaryState, buffers: SweepBuffers) -> None:
    """Verify sweep rows ``[0, count)`` of ``buffers`` in every group/half of ``state``."""
    n = min(int(buffers.count[0]), buffers.rows.shape[0])
    rows = buffers.rows[:n].long()
    slot_raw, pos, prev_raw = rows[:, 0], rows[:, 1], rows[:, 2]
    full_rows = state.groups[0].rows.shape[0]
    full_ok = (slot_raw > 0) & (slot_raw < full_rows)
    full_slot = torch.where(full_ok, slot_raw, 0)
    prev_ok = (prev_raw > 0) & (prev_raw < full_rows)
    prev_full = torch.where(prev_ok, prev_raw, 0)
    if state.layout == "swa":
        mapping = state.swa_mapping
        swa_rows = next(g.rows.shape[0] for g in state.groups if g.group == GROUP_SWA)
        swa_raw = torch.where(full_ok, mapping[full_slot].long(), 0)
        pred_swa_raw = torch.where(prev_ok, mapping[prev_full].long(), 0)
        pred_swa_ok = prev_ok & (pred_swa_raw > 0) & (pred_swa_raw < swa_rows)

    zero = torch.zeros_like(pos)
    seed = torch.full_like(pos, hashing.as_signed(hashing.CHAIN_SEED))
    records, entries = [], 0
    for group in state.groups:
        if group.group == GROUP_SWA:
            live = ~full_ok | (swa_raw != 0)
            g_full_ok = full_ok & live
            map_ok = (swa_raw > 0) & (swa_raw < swa_rows)
            mapped, pred_ok = swa_raw, pred_swa_ok
            pred = torch.where(pred_swa_ok, pred_swa_raw, 0)
        else:
            live = torch.ones_like(full_ok)
            g_full_ok = full_ok
            map_ok = torch.ones_like(full_ok)
            mapped, pred_ok, pred = slot_raw, prev_ok, prev_full
        ok = g_full_ok & map_ok
        slot = torch.where(ok, mapped, 0)
        row = group.rows[slot]
        prow = group.rows[pred]
        expected_link = torch.where(pos > 0, hashing.next_link(prow[:, 0], prow[:, 1], prow[:, 2]), seed)
        check_link = (pos == 0) | pred_ok

        nwords = _fingerprint_words(state, group)
        fp_stored = fp_now = zero
        bad_fp = unwritten = torch.zeros_like(ok)
        if nwords:
            # Every layer the stored fingerprints describe: a slice is bounded, and nobody else reads idle rows.
            bad_fp, unwritten, fp_stored, fp_now = check_fingerprints(group, nwords, slot, ok, None)
        unwritten = unwritten | (ok & (row[:, 2] == 0))
        row_bits = ok & ((row[:, 0] >> 32) != 0)
        bad_pos = ok & (row[:, 1] != pos)
        bad_link = ok & check_link & (row[:, 2] != expected_link)
        bad_map = live & g_full_ok & ~map_ok
        bad_pad = live & ~full_ok
        reasons = reason_bits((bad_pos, POSITION), (bad_link, LINK), (bad_fp, FINGERPRINT), (bad_map, SWA_UNMAPPED),
                              (bad_pad, PADDING_SLOT), (unwritten, UNWRITTEN), (row_bits, ROW_BITS))
        # A freed row the cache still holds: FREED, not POSITION (a cache that frees what it keeps).
        freed = ok & (row[:, 1] == FREED_POSITION)
        reasons = torch.where(freed, (reasons & ~POSITION) | FREED, reasons)
        stored, expected = zero, zero
        for bad, s, e in (
            (row_bits, row[:, 0], row[:, 0] & 0xFFFFFFFF),
            (unwritten, zero, zero),
            (bad_pad, slot_raw, zero),
            (bad_map, mapped, zero),
            (bad_fp, fp_stored, fp_now),
            (bad_link, row[:, 2], expected_link),
            (bad_pos, row[:, 1], pos),
        ):
            stored = torch.where(bad, s, stored)
            expected = torch.where(bad, e, expected)
        cols = [
            torch.full_like(pos, KERNEL_SWEEP),
            torch.full_like(pos, group.group * 2 + group.half),
            torch.where(ok, slot, slot_raw),
            pos,
            stored,
            expected,
            reasons,
            torch.full_like(pos, -1),
        ]
        bad = reasons != 0
        records.append(torch.stack([c[bad] for c in cols], dim=1))
        entries += int(live.sum())
    _append(state, records)
    buffers.counters[0] += 1
    buffers.counters[1] += n
    buffers.counters[2] += entries


def _fingerprint_words(state: CanaryState, group) -> int:
    """Leading int64 words of a real-KV row the fingerprint covers (0 = none), as the per-forward passes."""
    if state.realkv == "none" or group.kv_words is None:
        return 0
    if state.realkv == "partial":
        return min(PARTIAL_WORDS, group.kv_words.shape[1])
    return group.kv_words.shape[1]


def _append(state: CanaryState, records: list[torch.Tensor]) -> None:
    """Append records to the ring at ``count % RING`` (the newest ``RING`` kept), as the kernels do."""
    recs = torch.cat(records)
    if state.ring_count is None or recs.shape[0] == 0:
        return
    if state.ring is not None:
        ring_size = state.ring.shape[0]
        idx = (int(state.ring_count[0]) + torch.arange(recs.shape[0], device=recs.device)) % ring_size
        state.ring[idx[-ring_size:]] = recs[-ring_size:].to(state.ring.device)
    state.ring_count += recs.shape[0]


class TorchSweepOps:
    """The reference backend of the sweep."""

    name = "torch"

    def sweep(self, state: CanaryState, buffers: SweepBuffers) -> None:
        sweep(state, buffers)
