"""Request identity, the write side and freed slots: the Triton kernels against the torch reference, per layout.

A scenario gets the runtime's request-side buffers as a clean engine would have left them: each
request's identity entry names the last position its previous forward kept (``prefix - 1``) with
that row's token and link, and ``out_cache_loc`` names, per input id, the slot req_to_token holds
for it. Clean, nothing but the existing checks fires; each fault is reported with its own reason by
both backends alike (vLLM's cache-kernel test style: one test per check, parametrised by layout).
"""

import pytest
import torch

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.passes.state import (
    FREED,
    FREED_POSITION,
    IDENTITY,
    IDENTITY_FIELDS,
    IDENTITY_FIRST_NEW,
    IDENTITY_LAST_NEW,
    POSITION,
    WRITE_SLOT,
)

from .scenario import make_scenario, to_device
from .test_triton_vs_reference import _ops, run_both

LAYOUTS = [("mha", True), ("mla", False), ("swa", True)]
REASONS_NEW = IDENTITY | WRITE_SLOT | FREED


def request_side_scenario(layout, v_half, seed=0, prefix_lens=(20, 20, 9, 31), extend_lens=(1, 1, 3, 2),
                          device="cpu"):
    sc = make_scenario(layout, "partial", v_half, seed=seed, num_reqs=4, max_bs=6, share_prefix=False,
                       prefix_lens=list(prefix_lens), extend_lens=list(extend_lens), max_prefix=40)
    state, plan = sc.state, sc.plan
    rows = state.groups[0].rows
    identity = torch.full((state.req_to_token.shape[0], IDENTITY_FIELDS), -1, dtype=torch.int64)
    for req in sc.requests:
        if req.prefix:
            slot = req.full_slots[req.prefix - 1]
            identity[req.pool_index] = torch.tensor([req.prefix - 1, int(rows[slot, 0]), int(rows[slot, 2])])
    state.identity = identity
    plan.identity = IDENTITY_LAST_NEW
    # One slot per input id, in batch order; graph padding rows' entries are junk nobody reads.
    loc = torch.full((sc.input_ids.shape[0],), 7777, dtype=torch.int64)
    at = 0
    for req in sc.requests:
        loc[at : at + req.extend] = torch.tensor(req.full_slots[req.prefix : req.prefix + req.extend])
        at += req.extend
    plan.out_cache_loc = loc
    return to_device(sc, device)


def reasons_at(state, bit):
    return sorted((rec[7], rec[3]) for rec in state.ring[: int(state.ring_count[0])].tolist() if rec[6] & bit)


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_clean_batch_reports_nothing_new_and_records_identity(device, layout, v_half):
    sc, ref = run_both(request_side_scenario(layout, v_half, device=device), _ops())
    assert reasons_at(sc.state, REASONS_NEW) == []
    rows = sc.state.groups[0].rows
    for req in sc.requests:
        last = req.prefix + req.extend - 1
        slot = req.full_slots[last]
        want = [last, int(rows[slot, 0]), int(rows[slot, 2])]
        assert sc.state.identity[req.pool_index].tolist() == want
    assert torch.equal(sc.state.identity.cpu(), ref.state.identity)


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_target_verify_records_its_first_new_position(device, layout, v_half):
    sc = request_side_scenario(layout, v_half, extend_lens=(3, 3, 3, 3), device=device)
    sc.plan.identity = IDENTITY_FIRST_NEW
    sc, ref = run_both(sc, _ops())
    for req in sc.requests:
        assert int(sc.state.identity[req.pool_index, 0]) == req.prefix
    assert torch.equal(sc.state.identity.cpu(), ref.state.identity)


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_swapped_req_to_token_rows_of_equal_length_are_identity_violations(device, layout, v_half):
    sc = request_side_scenario(layout, v_half, device=device)
    a, b = sc.requests[0], sc.requests[1]  # equal prefixes (20): each chain is self-consistent
    table = sc.state.req_to_token
    row_a = table[a.pool_index, : a.prefix].clone()
    table[a.pool_index, : a.prefix] = table[b.pool_index, : b.prefix]
    table[b.pool_index, : b.prefix] = row_a
    sc, _ = run_both(sc, _ops(), passes=("pre",))
    assert reasons_at(sc.state, IDENTITY) == sorted([(a.pool_index, a.prefix - 1), (b.pool_index, b.prefix - 1)])


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_just_allocated_row_is_not_identity_checked(device, layout, v_half):
    sc = request_side_scenario(layout, v_half, device=device)
    a = sc.requests[0]
    sc.state.identity[a.pool_index] = -1  # what the req-pool alloc wrapper leaves for a new occupant
    sc.state.req_to_token[a.pool_index, : a.prefix] = sc.state.req_to_token[sc.requests[1].pool_index, : a.prefix]
    sc, _ = run_both(sc, _ops(), passes=("pre",))
    assert reasons_at(sc.state, IDENTITY) == []


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_kv_written_to_another_slot_is_a_write_slot_violation(device, layout, v_half):
    sc = request_side_scenario(layout, v_half, device=device)
    c = sc.requests[2]  # extend 3: its second new token's KV goes to another request's slot
    at = sum(r.extend for r in sc.requests[:2]) + 1
    sc.plan.out_cache_loc[at] = sc.requests[3].full_slots[0]
    sc, _ = run_both(sc, _ops())
    assert reasons_at(sc.state, WRITE_SLOT) == [(c.pool_index, c.prefix + 1)]


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_read_of_a_freed_row_is_a_freed_violation(device, layout, v_half):
    sc = request_side_scenario(layout, v_half, device=device)
    d = sc.requests[3]
    position = 5
    for group in sc.state.groups:
        if group.group == 0:
            group.rows[d.full_slots[position], 1] = FREED_POSITION  # what the allocator's free wrapper marks
    sc, _ = run_both(sc, _ops(), passes=("pre",))
    freed = reasons_at(sc.state, FREED)
    assert freed and set(freed) == {(d.pool_index, position)}
    assert (d.pool_index, position) not in reasons_at(sc.state, POSITION)


@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_slots_in_the_freed_buffer_are_marked_before_the_pass(device, layout, v_half):
    sc = request_side_scenario(layout, v_half)
    d, e = sc.requests[3], sc.requests[2]
    full_rows = sc.state.groups[0].rows.shape[0]
    # A prefix slot the allocator freed while d still reads it, a slot freed and handed to e's new token in the
    # same step (its mark must come before the pass writes it), an empty entry and one out of range (dropped).
    entries = [d.full_slots[5], e.full_slots[e.prefix], 0, full_rows + 3]
    sc.state.freed = torch.zeros(16, dtype=torch.int64)
    sc.state.freed[: len(entries)] = torch.tensor(entries)
    sc = to_device(sc, device)
    sc, _ = run_both(sc, _ops())
    assert set(reasons_at(sc.state, FREED)) == {(d.pool_index, 5)}
    assert int(sc.state.freed.count_nonzero()) == 0  # emptied for the next frees


def test_plan_with_identity_off_reports_no_identity_violation():
    """With the plan's identity off (a draft worker), a swapped row is not an identity violation."""
    sc = request_side_scenario("mha", True)
    sc.plan.identity = 0
    a, b = sc.requests[0], sc.requests[1]
    table = sc.state.req_to_token
    row_a = table[a.pool_index, : a.prefix].clone()
    table[a.pool_index, : a.prefix] = table[b.pool_index, : b.prefix]
    table[b.pool_index, : b.prefix] = row_a
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert reasons_at(sc.state, IDENTITY) == []
