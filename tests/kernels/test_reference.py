"""The torch reference against the pure-Python spec: clean histories stay clean, written rows
are the serial chain, and every fault class is reported with its reason bit."""

import pytest
import torch

from canary_instrument.runtime.passes import hashing, reference
from canary_instrument.runtime.passes.state import (
    FINGERPRINT,
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
)

from .faults import FAULTS, inject
from .scenario import make_scenario, violations

LAYOUTS = ["mha", "mla", "swa"]


def run_pass(sc):
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    reference.post_forward(sc.state, sc.plan)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("realkv", ["none", "partial", "all"])
@pytest.mark.parametrize("token_offset", [0, 1])
def test_clean_history_has_no_violations_and_next_pass_verifies_new_rows(layout, realkv, token_offset):
    sc = make_scenario(layout, realkv, seed=11, token_offset=token_offset)
    run_pass(sc)
    assert violations(sc.state) == []
    # Next pass: everything written above is now prefix and must verify clean, fingerprints included.
    n = len(sc.requests)
    sc.plan.prefix_lens[:n] += sc.plan.extend_lens[:n]
    sc.plan.extend_lens[:n] = 0
    before = int(sc.state.counters[2])
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert violations(sc.state) == []
    assert int(sc.state.counters[2]) > before


def test_written_rows_are_the_serial_chain_with_fingerprints_after_post():
    sc = make_scenario("mha", "partial", seed=5, prefix_lens=[0, 7], extend_lens=[9, 5], num_reqs=2, share_prefix=False)
    run_pass(sc)
    for req in sc.requests:
        links = hashing.chain_int(req.tokens[: req.prefix + req.extend])
        for grp in sc.state.groups:
            for p in range(req.prefix, req.prefix + req.extend):
                token, pos, link, fp = grp.rows[req.full_slots[p]].tolist()
                assert (token, pos, link & hashing.U64) == (req.tokens[p], p, links[p])
                words = [w & hashing.U64 for w in grp.kv_words[req.full_slots[p], :2].tolist()]
                assert fp & hashing.U64 == hashing.fingerprint_int(words)


def test_disabled_plan_touches_nothing():
    sc = make_scenario("swa", "all", seed=2)
    sc.plan.enabled[0] = 0
    rows = [g.rows.clone() for g in sc.state.groups]
    run_pass(sc)
    assert all(torch.equal(a, g.rows) for a, g in zip(rows, sc.state.groups))
    assert sc.state.counters.tolist() == [0, 0, 0, 0]


def test_empty_batch_counts_runs_only():
    sc = make_scenario("mha", "none", seed=2, num_reqs=0)
    run_pass(sc)
    assert sc.state.counters.tolist() == [1, 1, 0, 0]
    assert violations(sc.state) == []


def test_swa_window_limits_verification_and_skips_link_at_evicted_edge():
    sc = make_scenario("swa", "none", seed=4, num_reqs=1, prefix_lens=[30], extend_lens=[2], swa_window=8)
    run_pass(sc)
    assert violations(sc.state) == []
    # FULL halves verify 30 + 2 positions each; SWA halves the last 8 of the prefix + the 2 new ones.
    assert sc.state.group_verified.tolist() == [2 * 32, 2 * 10]


def test_ring_wraps_without_overflowing_memory():
    sc = make_scenario("mha", "none", seed=9, num_reqs=2, prefix_lens=[20, 20], extend_lens=[0, 0], ring_size=4,
                       share_prefix=False)
    sc.state.groups[0].rows[:, 1] += 1000  # every position of every request is wrong
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert int(sc.state.ring_count[0]) == 40
    assert sc.state.ring.shape == (4, 8)
    assert {int(r) for r in sc.state.ring[:, 6]} == {POSITION | LINK}


EXPECTED_BITS = {
    "remapped_req_to_token": POSITION,
    "wrong_position": POSITION,
    "flipped_kv_byte": FINGERPRINT,
    "wrong_token": TOKEN,
    "bad_swa_mapping": SWA_UNMAPPED,
    "padding_slot": PADDING_SLOT,
    "broken_link": LINK,
    "zeroed_fingerprint": UNWRITTEN,
    "token_high_bit": ROW_BITS,
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_reported_with_its_reason_bit(layout, fault):
    sc = make_scenario(layout, "partial", seed=21, num_reqs=3, prefix_lens=[24, 17, 30], extend_lens=[3, 1, 0],
                       layers=3)
    target = inject(sc, fault)
    if target is None:
        pytest.skip(f"{fault} does not apply to the {layout} layout")
    run_pass(sc)
    hits = [r for r in violations(sc.state) if (r[1], r[3], r[7]) == target.key]
    assert hits, f"{fault}: nothing reported at {target}"
    assert hits[0][0] in (KERNEL_PRE, KERNEL_POST)
    assert hits[0][6] & EXPECTED_BITS[fault], hits
    if fault == "bad_swa_mapping":
        assert target.key[0] // 2 == GROUP_SWA


@pytest.mark.parametrize("layout", LAYOUTS)
def test_draft_rows_that_disagree_with_the_target_are_reported(layout):
    sc = make_scenario(layout, "none", seed=21, num_reqs=3, prefix_lens=[24, 17, 30], extend_lens=[3, 1, 0],
                       token_offset=1, target_margin=2)
    target = inject(sc, "wrong_token")
    run_pass(sc)
    hits = [r for r in violations(sc.state) if (r[1], r[3], r[7]) == target.key]
    assert hits and hits[0][0] == KERNEL_PRE and hits[0][6] == TOKEN


def test_the_sampled_token_is_checked_once_and_only_when_the_plan_asks():
    sc = make_scenario("mha", "none", seed=3, num_reqs=2, prefix_lens=[5, 7], extend_lens=[1, 1], share_prefix=False)
    rows = [r.pool_index for r in sc.requests]
    sc.state.sampled_tokens[rows] += 1  # every request was fed another token than the sampled one
    quiet = sc.clone()
    quiet.plan.check_sampled = False  # e.g. an extend or a target verify: not checked...
    run_pass(quiet)
    assert violations(quiet.state) == []
    assert quiet.state.sampled_tokens.tolist() == [-1] * quiet.state.sampled_tokens.shape[0]  # ...but consumed
    run_pass(sc)
    assert {(r[3], r[6]) for r in violations(sc.state)} == {(5, TOKEN), (7, TOKEN)}
