"""The request-side perturbation kinds on small real tensors: what each corrupts and restores, and that the
reference passes report it with its own reason (identity, write_slot, freed), scored from the records."""

import pytest
import torch

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.perturb import score
from canary_instrument.runtime.checks.request_side import RequestSide
from canary_instrument.runtime.passes.state import IDENTITY_FIELDS, IDENTITY_LAST_NEW

from .test_perturb_kinds import forward_batch, next_step, one_step, perturber, records, scenario

LAYOUTS = ["mha", "mla", "swa"]


def with_request_side(sc, fb):
    """The buffers a target's manager keeps: identity entries as the requests' last forwards left them, the
    batch's out_cache_loc in the plan, and the allocator-side queue the free wrapper feeds."""
    state, rows = sc.state, sc.state.groups[0].rows
    state.identity = torch.full((state.req_to_token.shape[0], IDENTITY_FIELDS), -1, dtype=torch.int64,
                                device=state.req_to_token.device)
    for req in sc.requests:
        slot = req.full_slots[req.prefix - 1]
        state.identity[req.pool_index] = torch.tensor([req.prefix - 1, int(rows[slot, 0]), int(rows[slot, 2])])
    sc.plan.identity = IDENTITY_LAST_NEW
    sc.plan.out_cache_loc = fb.out_cache_loc
    return RequestSide(state)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_req_row_swap_is_an_identity_violation_that_forward_and_restored(layout, seed):
    sc = scenario(layout, decode=True, v_half=layout != "mla", seed=seed)
    fb = forward_batch(sc, decode=True)
    with_request_side(sc, fb)
    table = sc.state.req_to_token.clone()
    pert = perturber("req_row_swap", sc.state, seed)
    found = one_step(sc, fb, pert)
    assert torch.equal(sc.state.req_to_token, table), "the rows must be restored after the forward"
    [injection] = pert.drain()
    assert injection.applied and injection.position == injection.get("length") - 1
    identity_hits = {(v.req_pool_index, v.position) for v in found if "identity" in v.reasons}
    assert (injection.req, injection.position) in identity_hits
    result = score([injection], found)
    assert (result.reported, result.kinds["req_row_swap"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_req_row_swap_of_requests_with_the_same_history_changes_nothing_and_is_not_applied(layout, seed):
    """Two requests with the same tokens hold the same KV: exchanging their rows is invisible and harmless."""
    # Equal prefixes: on an SWA pool a longer request's window would reach slots the shorter one released.
    sc = scenario(layout, decode=True, v_half=layout != "mla", seed=seed, prefix_lens=(9, 9, 9), same_history=True)
    fb = forward_batch(sc, decode=True)
    with_request_side(sc, fb)
    pert = perturber("req_row_swap", sc.state, seed)
    assert one_step(sc, fb, pert) == []
    [injection] = pert.drain()
    assert not injection.applied


def test_req_row_swap_on_an_swa_pool_is_applied_where_one_window_reaches_below_the_other():
    sc = scenario("swa", decode=True, seed=0, prefix_lens=(12, 7, 9), same_history=True)
    fb = forward_batch(sc, decode=True)
    with_request_side(sc, fb)
    pert = perturber("req_row_swap", sc.state, 0)
    found = one_step(sc, fb, pert)
    [injection] = pert.drain()
    assert injection.applied
    assert score([injection], found).reported == 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_slot_is_a_write_slot_violation_at_both_positions(layout, seed):
    sc = scenario(layout, v_half=layout != "mla", seed=seed)
    fb = forward_batch(sc)
    with_request_side(sc, fb)
    before = fb.out_cache_loc.clone()
    pert = perturber("write_slot", sc.state, seed)
    found = one_step(sc, fb, pert)
    assert torch.equal(fb.out_cache_loc, before), "out_cache_loc must be restored after the forward"
    [injection] = pert.drain()
    hits = {(v.req_pool_index, v.position) for v in found if "write_slot" in v.reasons}
    assert hits == {(injection.req, injection.position), (injection.get("other_req"), injection.get("other_position"))}
    result = score([injection], found)
    assert (result.reported, result.kinds["write_slot"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_premature_free_is_a_freed_violation_that_forward_and_restored(layout, seed):
    sc = scenario(layout, v_half=layout != "mla", seed=seed)
    fb = forward_batch(sc)
    with_request_side(sc, fb)
    rows = [g.rows.clone() for g in sc.state.groups]
    pert = perturber("premature_free", sc.state, seed)
    found = one_step(sc, fb, pert)
    [injection] = pert.drain()
    freed = {(v.req_pool_index, v.position) for v in found if "freed" in v.reasons}
    assert (injection.req, injection.position) in freed
    assert not any("position" in v.reasons for v in found)
    assert int(sc.state.groups[0].rows[injection.slot, 1]) == injection.position, "the mark is taken back"
    result = score([injection], found)
    assert (result.reported, result.kinds["premature_free"].delays, result.unattributed) == (1, [0], [])
    next_step(sc)
    since = int(sc.state.ring_count[0])
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert records(sc.state, 2, since) == [], "nothing is left for the next forward to report"
    assert len(rows) == len(sc.state.groups)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_req_row_swap_leaves_nothing_for_the_next_forward(layout, seed):
    sc = scenario(layout, decode=True, v_half=layout != "mla", seed=seed)
    fb = forward_batch(sc, decode=True)
    with_request_side(sc, fb)
    pert = perturber("req_row_swap", sc.state, seed)
    assert one_step(sc, fb, pert)
    next_step(sc)
    since = int(sc.state.ring_count[0])
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert records(sc.state, 2, since) == []


def test_frees_land_in_the_freed_buffer_in_order_until_the_next_forward():
    """Every free noted since the last forward sits in ``state.freed`` in order (2-D frees flattened); the next
    forward's entry starts the buffer over, a new buffer (a reinstall) is written, and a free that does not fit
    waits for the entry's marks."""
    sc = scenario("mha", decode=True, v_half=True, seed=0)
    side = RequestSide(sc.state)
    sc.state.freed = torch.zeros(8, dtype=torch.int64)
    side.on_free(torch.tensor([5, 6, 7]))
    side.on_free(torch.tensor([[9], [10]]))
    assert sc.state.freed.tolist() == [5, 6, 7, 9, 10, 0, 0, 0] and side.pending
    side.apply()
    side.on_free(torch.tensor([11, 12, 13], dtype=torch.int32))  # same size as the first: its kept view
    assert sc.state.freed[:3].tolist() == [11, 12, 13] and not side.freed
    sc.state.freed = torch.zeros(8, dtype=torch.int64)
    side.apply()
    side.on_free(torch.tensor([1, 2, 3]))
    assert sc.state.freed[:3].tolist() == [1, 2, 3]
    side.on_free(torch.arange(20, 26))  # 3 + 6 > 8: kept for the entry's marks
    assert [t.tolist() for t in side.freed] == [list(range(20, 26))]
    side.on_free(None)  # not a tensor, or empty: nothing to note
    side.on_free([4, 5])
    side.on_free(torch.tensor([], dtype=torch.int64))
    assert sc.state.freed[:3].tolist() == [1, 2, 3] and side.offset == 3 and len(side.freed) == 1


def test_write_slot_leaves_a_forward_prepared_before_its_site_alone():
    """sglang's spec-v2 target verify: the plan stream loads the verify graph's static buffers (out_cache_loc among
    them) before ModelRunner.forward, whose replay copies only input_ids and positions again. Exchanging the batch's
    out_cache_loc entries at the site then changes nothing the forward (or the canary's check) reads: the kind must
    not count such an injection, which nothing could report."""
    sc = scenario("mha", seed=0)
    fb = forward_batch(sc)
    with_request_side(sc, fb)
    fb.needs_forward_metadata_init = lambda: False  # sglang's ForwardBatch, marked ready by the plan stream
    sc.plan.out_cache_loc = fb.out_cache_loc.clone()  # the graph's static copy, loaded before the site
    pert = perturber("write_slot", sc.state, 0)
    found = one_step(sc, fb, pert)
    assert pert.drain() == [] and pert.counts["write_slot"] == 0
    assert [v for v in found if "write_slot" in v.reasons] == []
    # Prepared at the site (sglang: the eager path, and decode graphs loaded inside the forward): injected as before.
    fb.needs_forward_metadata_init = lambda: True
    sc.plan.out_cache_loc = fb.out_cache_loc
    found = one_step(sc, fb, pert, step=2)
    assert len(pert.drain()) == 1 and any("write_slot" in v.reasons for v in found)
