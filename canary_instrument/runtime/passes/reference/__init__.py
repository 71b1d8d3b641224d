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
  0, whose ``pad_mark`` entry is negative or whose prefix is below ``min_prefix`` are graph padding and
  skipped, but their tokens still occupy ``input_ids``.
- ``prefix_links`` off: the pre-forward pass does not check the link of the verified rows (every other
  field still is; the post-forward pass checks the links of the rows it wrote).
- Sampled tokens reach ``sampled_tokens`` through ``sample_staging``: every pre-forward pass first
  files the staging entries of the last forward's batch under that forward's rows
  (``sample_rows``), clears them, and leaves its own rows (graph padding rows included).
- Expected tokens: with ``sampled_tokens`` (target), the post-forward pass of a decode
  (``check_sampled``) compares the row at each request's first new position with its row's
  entry (>= 0), and every post-forward pass then clears the entries of its requests that wrote
  anything. With
  ``target_rows`` (draft worker), the pre-forward pass compares each position
  ``p < prefix - target_margin`` (only the last ``target_window`` of them when it is > 0) with the token
  of the target's row of position ``p + 1``
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

import torch

from .. import hashing, layers
from ..state import FREED_POSITION, GROUP_FULL, GROUP_SWA, KERNEL_POST, KERNEL_PRE, CanaryState, PlanInputs
from .slots import PARTIAL_WORDS, batch_of, check_fingerprints, checked_layers, fingerprint_words, items, window_lo
from .verify import verify
from .write import file_samples, record_identity, write_new_rows

__all__ = ["PARTIAL_WORDS", "TorchCanaryOps", "check_fingerprints", "checked_layers", "fingerprint_words",
           "mark_freed_buffer", "post_forward", "pre_forward"]


def append_records(state: CanaryState, records: list[torch.Tensor]) -> None:
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


def count_run(state: CanaryState, run_index: int, verified: dict[int, int], written: int) -> None:
    if state.counters is not None:
        state.counters[run_index] += 1
        state.counters[2] += sum(verified.values())
        state.counters[3] += written
    if state.group_verified is not None:
        for g, n in verified.items():
            state.group_verified[g] += n


def publish(state: CanaryState) -> None:
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
        file_samples(state, plan)
    batch = batch_of(plan)
    lo = window_lo(state, batch)
    records, verified, written = [], {}, 0
    for group in state.groups:
        start = lo if group.group == GROUP_SWA else torch.zeros_like(batch.prefix)
        req, pos = items(start, batch.prefix)
        recs, _ = verify(state, group, KERNEL_PRE, batch, req, pos, lo)
        records.append(recs)
        verified[group.group] = verified.get(group.group, 0) + pos.shape[0]
    for group in state.groups:
        req, pos = items(batch.prefix, batch.prefix + batch.extend)
        recs, n_written = write_new_rows(state, group, batch, input_ids, req, pos)
        records.append(recs)
        written += n_written
    append_records(state, records)
    count_run(state, 0, verified, written)


def post_forward(state: CanaryState, plan: PlanInputs) -> None:
    """Verify the rows written this forward, then store their real-KV fingerprints; publish the status."""
    if int(plan.enabled[0]) == 0:
        publish(state)
        return
    batch = batch_of(plan)
    lo = window_lo(state, batch)
    records, verified = [], {}
    for group in state.groups:
        req, pos = items(batch.prefix, batch.prefix + batch.extend)
        recs, slots = verify(state, group, KERNEL_POST, batch, req, pos, lo)
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
    record_identity(state, batch)
    if state.sampled_tokens is not None:
        # Consumed: an entry is only ever checked by the forward right after the sample that wrote it.
        state.sampled_tokens[batch.req_pool[batch.extend > 0]] = -1
    append_records(state, records)
    count_run(state, 1, verified, 0)
    publish(state)


class TorchCanaryOps:
    """The reference backend behind ``get_ops(..., backend="torch")``."""

    name = "torch"

    def pre_forward(self, state: CanaryState, plan: PlanInputs, input_ids: torch.Tensor) -> None:
        pre_forward(state, plan, input_ids)

    def post_forward(self, state: CanaryState, plan: PlanInputs) -> None:
        post_forward(state, plan)

    def mark_freed(self, state: CanaryState) -> None:
        mark_freed_buffer(state)
