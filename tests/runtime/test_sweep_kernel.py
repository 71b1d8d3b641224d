"""The rendered sweep kernel against its byte-exact torch reference, per layout and real-KV mode,
and the reference's verdicts on the cases the sweep exists for.

Pools come from the per-forward scenario builder; the reference pre/post-forward passes then write
and fingerprint each request's new tokens, so every position a request holds carries the rows the
runtime would have left. Sweep rows are those positions as a radix-cache walk emits them.
"""

import pytest
import torch
from kernels.scenario import make_scenario, to_device, violations

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.features import sweep_reference
from canary_instrument.runtime.passes.layers import layer_words, store_fingerprint
from canary_instrument.runtime.passes.state import (
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
)
from canary_instrument.runtime.features.sweep_buffers import SweepBuffers
from canary_instrument.runtime.features.sweep_triton import TritonSweepOps

LAYOUT_HALVES = [("mha", True), ("mha", False), ("mla", False), ("swa", True), ("swa", False)]
CASES = [(layout, v_half, realkv) for layout, v_half in LAYOUT_HALVES for realkv in ("none", "partial", "all")]
FULL_SLOTS, SWA_SLOTS, WINDOW = 160, 96, 6
LAYERS = 3  # every layer's fingerprint is swept: layer 0's in the row, the others' in the group's table


def written_scenario(layout, v_half, realkv, seed=7, device="cpu"):
    """Three requests (one sharing another's prefix) whose every position holds written, fingerprinted rows."""
    sc = make_scenario(layout, realkv, v_half, seed=seed, num_reqs=3, max_bs=4, prefix_lens=[13, 9, 0],
                       extend_lens=[2, 3, 11], swa_window=WINDOW, max_context=48, full_slots=FULL_SLOTS,
                       swa_slots=SWA_SLOTS, layers=LAYERS)
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    reference.post_forward(sc.state, sc.plan)
    sc.state.ring_count.zero_()
    return to_device(sc, device)


def request_rows(sc):
    """(slot, position, prev_slot) of every position of every request; -1 before position 0."""
    rows = []
    for req in sc.requests:
        for p, slot in enumerate(req.full_slots):
            rows.append((slot, p, req.full_slots[p - 1] if p else -1))
    return rows


def buffers(rows, capacity=None, device="cpu"):
    capacity = capacity or max(1, len(rows))
    table = torch.zeros((capacity, 3), dtype=torch.int64)
    if rows:
        table[: len(rows)] = torch.tensor(rows, dtype=torch.int64)
    return SweepBuffers(
        count=torch.tensor([len(rows)], dtype=torch.int64, device=device),
        rows=table.to(device),
        counters=torch.zeros(3, dtype=torch.int64, device=device),
    )


def run_reference(sc, rows, capacity=None):
    ref = to_device(sc.clone(), "cpu")
    buf = buffers(rows, capacity)
    sweep_reference.sweep(ref.state, buf)
    return ref, buf


def adversarial_rows(sc):
    """Rows a broken tree or a corrupted cache would hand the sweep, next to clean ones."""
    req = sc.requests[0]
    s = req.full_slots
    return [
        (s[5], 5, -1),  # predecessor unknown (evicted): link not checked, the row is still verified
        (s[5], 6, s[5]),  # the walk says position 6: POSITION
        (s[7], 7, s[2]),  # the wrong predecessor: LINK
        (0, 3, s[2]),  # padding slot inside a cached path
        (FULL_SLOTS + 5, 4, s[3]),  # a slot beyond the pool
        (s[0], 0, 99),  # position 0 checks the chain seed whatever prev says
        (s[4], 4, FULL_SLOTS + 1),  # predecessor out of range: link skipped
    ]


@pytest.mark.parametrize("layout,v_half,realkv", CASES)
def test_kernel_matches_reference(device, layout, v_half, realkv):
    sc = written_scenario(layout, v_half, realkv, device=device)
    rows = request_rows(sc) + adversarial_rows(sc)
    # Garbage rows where nothing was written (slots the scenario never used), and a corrupted real KV byte.
    rows += [(slot, 2, slot - 1) for slot in range(FULL_SLOTS - 4, FULL_SLOTS)]
    if realkv != "none":
        sc.state.groups[0].kv_words[sc.requests[1].full_slots[1], 0] ^= 1 << 13
        last_full = [g for g in sc.state.groups if g.group == 0][-1]
        layer_words(last_full, 2)[sc.requests[2].full_slots[9], 1] ^= 1 << 40
        store_fingerprint(sc.state.groups[0], sc.requests[2].full_slots[3], 1, 0)
    sc.state.groups[0].rows[sc.requests[0].full_slots[2], 0] ^= 1 << 45
    sc.state.groups[0].rows[sc.requests[2].full_slots[6], 1] = FREED_POSITION  # freed, yet still in the cache
    ref, ref_buf = run_reference(sc, rows, capacity=len(rows) + 5)
    buf = buffers(rows, capacity=len(rows) + 5, device=device)
    TritonSweepOps(block=8, programs=3).sweep(sc.state, buf)
    assert int(sc.state.ring_count[0]) == int(ref.state.ring_count[0]) > 0
    assert violations(sc.state) == violations(ref.state)
    assert buf.counters.tolist() == ref_buf.counters.tolist()
    for got, want in zip(sc.state.groups, ref.state.groups):
        assert torch.equal(got.rows.cpu(), want.rows), "the sweep must not write canary rows"


@pytest.mark.parametrize("layout,v_half,realkv", [("mha", True, "partial"), ("swa", True, "partial"),
                                                  ("mla", False, "all")])
def test_clean_cache_reports_nothing(layout, v_half, realkv):
    sc = written_scenario(layout, v_half, realkv)
    rows = request_rows(sc)
    ref, buf = run_reference(sc, rows)
    assert violations(ref.state) == []
    launches, swept, entries = buf.counters.tolist()
    assert (launches, swept) == (1, len(rows))
    if layout != "swa":
        assert entries == len(rows) * len(sc.state.groups)
    else:  # the SWA group verifies only slots still mapped (the last WINDOW positions of each request)
        mapped = sum(int(sc.state.swa_mapping[s] != 0) for s, _, _ in rows)
        halves = len(sc.state.groups) // 2
        assert entries == len(rows) * halves + mapped * halves
        assert mapped < len(rows)


def _reasons_at(state, slot, position):
    return {(r[1], r[6]) for r in violations(state) if r[2] == slot and r[3] == position}


def test_reference_verdicts_per_row():
    sc = written_scenario("mha", False, "partial")
    s = sc.requests[0].full_slots
    ref, _ = run_reference(sc, adversarial_rows(sc))
    records = violations(ref.state)
    assert {r[0] for r in records} == {KERNEL_SWEEP} and {r[7] for r in records} == {-1}
    assert _reasons_at(ref.state, s[5], 5) == set()
    assert _reasons_at(ref.state, s[5], 6) == {(0, POSITION | LINK)}
    assert _reasons_at(ref.state, s[7], 7) == {(0, LINK)}
    assert _reasons_at(ref.state, 0, 3) == {(0, PADDING_SLOT)}
    assert _reasons_at(ref.state, FULL_SLOTS + 5, 4) == {(0, PADDING_SLOT)}
    assert _reasons_at(ref.state, s[0], 0) == set()
    assert _reasons_at(ref.state, s[4], 4) == set()


def test_flipped_real_kv_byte_of_a_cached_slot_is_a_fingerprint_violation():
    sc = written_scenario("mha", True, "partial")
    slot = sc.requests[2].full_slots[4]
    v_words = sc.state.groups[1].kv_words
    v_words.view(torch.uint8)[slot, 9] ^= 0x10  # byte 9 of layer 0's V row: inside the 16 fingerprinted bytes
    ref, _ = run_reference(sc, request_rows(sc))
    assert [(r[1], r[2], r[3], r[6]) for r in violations(ref.state)] == [(1, slot, 4, FINGERPRINT)]


def test_every_layer_and_every_bit_of_a_cached_row_is_checked():
    sc = written_scenario("mha", True, "partial")
    flipped, zeroed, high = sc.requests[2].full_slots[4], sc.requests[2].full_slots[6], sc.requests[0].full_slots[3]
    layer_words(sc.state.groups[1], 2).view(torch.uint8)[flipped, 3] ^= 0x01  # layer 2's V row
    store_fingerprint(sc.state.groups[0], zeroed, 1, 0)  # layer 1's K fingerprint lost
    sc.state.groups[0].rows[high, 0] ^= 1 << 63  # the token word's top bit
    ref, _ = run_reference(sc, request_rows(sc))
    assert sorted((r[1], r[2], r[6]) for r in violations(ref.state)) == sorted(
        [(1, flipped, FINGERPRINT), (0, zeroed, UNWRITTEN), (0, high, ROW_BITS)])


def test_swa_group_skips_unmapped_slots_and_reports_bad_mappings():
    sc = written_scenario("swa", False, "none")
    req = sc.requests[0]  # prefix 13 + 2 new tokens, window 6: positions 7.. are mapped
    mapping = sc.state.swa_mapping
    assert int(mapping[req.full_slots[3]]) == 0
    bad = req.full_slots[12]
    mapping[bad] = SWA_SLOTS + 7  # beyond the SWA pool
    rows = [(req.full_slots[p], p, req.full_slots[p - 1] if p else -1) for p in range(len(req.full_slots))]
    ref, buf = run_reference(sc, rows)
    assert {(r[1], r[2], r[3], r[6], r[4]) for r in violations(ref.state)} == {
        (GROUP_SWA * 2, bad, 12, SWA_UNMAPPED, SWA_SLOTS + 7)
    }
    mapped = sum(int(mapping[s] != 0) for s, _, _ in rows)
    assert buf.counters.tolist() == [1, len(rows), len(rows) + mapped]


def test_swa_link_is_skipped_across_an_evicted_predecessor_only():
    sc = written_scenario("swa", False, "none")
    req = sc.requests[0]
    first = next(p for p, s in enumerate(req.full_slots) if int(sc.state.swa_mapping[s]) != 0)
    assert first > 0
    # A wrong link at the first in-window position is not checked there (its predecessor's SWA slot is
    # gone), but the next position's link is derived from it and fails.
    sc.state.groups[1].rows[int(sc.state.swa_mapping[req.full_slots[first]]), 2] ^= 1
    rows = [(req.full_slots[p], p, req.full_slots[p - 1] if p else -1) for p in range(len(req.full_slots))]
    ref, _ = run_reference(sc, rows)
    assert {(r[1], r[3], r[6]) for r in violations(ref.state)} == {(GROUP_SWA * 2, first + 1, LINK)}


def test_count_above_capacity_is_clamped_and_empty_sweeps_count_a_launch(device):
    sc = written_scenario("mla", False, "none", device=device)
    rows = request_rows(sc)
    buf = buffers(rows, device=device)
    buf.count[0] = len(rows) + 100  # a count beyond the buffer reads no memory past it
    TritonSweepOps(block=8, programs=2).sweep(sc.state, buf)
    assert buf.counters.tolist() == [1, len(rows), len(rows)]
    empty = buffers([], capacity=4, device=device)
    TritonSweepOps(block=8, programs=2).sweep(sc.state, empty)
    assert empty.counters.tolist() == [1, 0, 0]


def test_freed_row_the_cache_still_holds_is_a_freed_violation():
    """A cache that keeps a slot the allocator freed: FREED (not POSITION) where the row is read, LINK after it."""
    sc = written_scenario("mha", False, "partial")
    s = sc.requests[2].full_slots
    sc.state.groups[0].rows[s[6], 1] = FREED_POSITION
    ref, _ = run_reference(sc, request_rows(sc))
    assert _reasons_at(ref.state, s[6], 6) == {(0, FREED)}
    assert _reasons_at(ref.state, s[7], 7) == {(0, LINK)}
