"""The rendered Triton kernels against the byte-exact torch reference, per layout and real-KV mode.

Rows, counters, per-group counts and ring records must agree exactly (records as a multiset).
On CPU this runs through Triton's interpreter with small tiles so multi-block and multi-chunk
paths are exercised on small pools; on a GPU the same tests run compiled.
"""

import pytest
import torch

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.passes.state import (
    FINGERPRINT,
    GROUP_SWA,
    LINK,
    PADDING_SLOT,
    POSITION,
    ROW_BITS,
    SWA_UNMAPPED,
    TOKEN,
    UNWRITTEN,
)
from canary_instrument.runtime.passes.triton_ops import TritonCanaryOps

from canary_instrument.runtime.passes.layers import fingerprint_table, layer_words

from .faults import FAULTS, inject
from .scenario import make_scenario, to_device, violations

BLOCK = 8  # small tiles: requests span several verify blocks and write chunks
LAYOUT_HALVES = [("mha", True), ("mha", False), ("mla", False), ("swa", True), ("swa", False)]
CASES = [
    (layout, v_half, realkv, offset)
    for layout, v_half in LAYOUT_HALVES
    for realkv in ("none", "partial", "all")
    for offset in (0, 1)
    if offset == 0 or realkv == "partial"
]


def _ops(block=BLOCK):
    return TritonCanaryOps(block=block, programs=3)


def assert_same(kernel_state, ref_state):
    for got, want in zip(kernel_state.groups, ref_state.groups):
        assert torch.equal(got.rows.cpu(), want.rows.cpu()), f"rows differ in group {got.group} half {got.half}"
        if got.kv_words is not None:
            assert torch.equal(fingerprint_table(got).cpu(), fingerprint_table(want).cpu()), (
                f"layer fingerprints differ in group {got.group} half {got.half}")
    assert kernel_state.counters.tolist() == ref_state.counters.tolist()
    assert kernel_state.group_verified.tolist() == ref_state.group_verified.tolist()
    assert int(kernel_state.ring_count[0]) == int(ref_state.ring_count[0])
    assert violations(kernel_state) == violations(ref_state)


def run_both(sc, ops, passes=("pre", "post")):
    ref = sc.clone()
    ref = to_device(ref, "cpu")
    for name in passes:
        if name == "pre":
            ops.pre_forward(sc.state, sc.plan, sc.input_ids)
            reference.pre_forward(ref.state, ref.plan, ref.input_ids)
        else:
            ops.post_forward(sc.state, sc.plan)
            reference.post_forward(ref.state, ref.plan)
    assert_same(sc.state, ref.state)
    return sc, ref


@pytest.mark.parametrize("layer_chunk,few_layers", [(1, 1), (2, 4), (4, 2), (8, 8)])
def test_post_pass_fingerprints_every_layer_whatever_the_chunk(device, layer_chunk, few_layers):
    # 5 layers: chunks of 2 and 4 end in a partial chunk, 8 holds every layer in one. Blocks of 8 lanes: the
    # 9-token extend fills one (all lanes, chunks of layer_chunk) and leaves one live lane in the next (with
    # the decode-like blocks, chunks of few_layers).
    sc = make_scenario("swa", "partial", True, seed=3, num_reqs=3, max_bs=4, prefix_lens=[7, 0, 4],
                       extend_lens=[1, 9, 2], swa_window=6, max_context=32, full_slots=128, swa_slots=64,
                       layers=5, device=device)
    run_both(sc, TritonCanaryOps(block=BLOCK, programs=3, layer_chunk=layer_chunk, few_layers=few_layers))
    assert violations(sc.state) == []


@pytest.mark.parametrize("layout,v_half,realkv,token_offset", CASES)
def test_kernels_match_reference_over_two_steps(device, layout, v_half, realkv, token_offset):
    # 3 real requests in a 5-wide graph batch (padding entries hold junk), request 1 shares request
    # 0's prefix slots, one request has an empty prefix, one writes 3 chunks; SWA evicts beyond W=6.
    sc = make_scenario(layout, realkv, v_half, seed=7, num_reqs=3, max_bs=5, prefix_lens=[13, 9, 0],
                       extend_lens=[2, 1, 19], token_offset=token_offset, swa_window=6, max_context=48,
                       full_slots=160, swa_slots=96, layers=3, device=device)
    run_both(sc, _ops())
    assert violations(sc.state) == []
    # Step 2: all rows written above are prefix now and must verify clean, fingerprints included.
    sc.plan.prefix_lens[:3] += sc.plan.extend_lens[:3]
    sc.plan.extend_lens[:3] = 0
    run_both(sc, _ops(), passes=("pre",))
    assert violations(sc.state) == []


@pytest.mark.parametrize("realkv", ["partial", "all"])
def test_an_swa_pool_whose_full_half_has_no_layers_verifies_and_catches_a_flip(device, realkv):
    # A multi-layer EAGLE draft's pool: every layer a sliding-window one, so the full half's real-KV words are one
    # zero row seen at every slot (row stride 0); its rows still keep each slot's token, position and link.
    sc = make_scenario("swa", realkv, True, seed=5, num_reqs=3, max_bs=4, prefix_lens=[12, 7, 0],
                       extend_lens=[1, 1, 9], swa_window=6, max_context=40, full_slots=128, swa_slots=64,
                       layerless_full=True, device=device)
    run_both(sc, _ops())
    assert violations(sc.state) == []
    sc.plan.prefix_lens[:3] += sc.plan.extend_lens[:3]
    sc.plan.extend_lens[:3] = 0
    req = sc.requests[0]
    p = int(sc.plan.prefix_lens[0]) - 1  # in the window
    swa_k = next(g for g in sc.state.groups if g.group == GROUP_SWA)
    swa_k.kv_words[int(sc.state.swa_mapping[req.full_slots[p]]), 0] ^= 1 << 9
    run_both(sc, _ops(), passes=("pre",))
    hits = [r for r in violations(sc.state) if (r[1], r[3], r[7]) == (GROUP_SWA * 2 + swa_k.half, p, req.pool_index)]
    assert hits and hits[0][6] & FINGERPRINT, violations(sc.state)


LAYERS = 4


@pytest.mark.parametrize("layout,v_half", LAYOUT_HALVES)
@pytest.mark.parametrize("realkv", ["partial", "all"])
def test_a_flip_in_any_layer_is_caught_within_the_rotation(device, layout, v_half, realkv):
    # A bit of layer `layer` flips in a prefix slot every request reads; decode passes follow (pre, post, one new
    # token each). realkv=all reports it at the next pass; partial when the request's layer cursor reaches the
    # layer: after (layer - cursor) % LAYERS passes, so within LAYERS passes. Both backends agree at every pass.
    sc = make_scenario(layout, realkv, v_half, seed=29, num_reqs=2, max_bs=2, prefix_lens=[12, 9],
                       extend_lens=[LAYERS, LAYERS], swa_window=6, max_context=32, full_slots=96, swa_slots=64,
                       layers=LAYERS, expected_tokens=False, device=device)
    sc.plan.extend_lens[:2] = 1  # slots exist for LAYERS decode passes
    req = sc.requests[0]
    layer = 1 + int(req.pool_index) % (LAYERS - 1)
    position = req.prefix - 2  # inside the SWA window too
    full_slot = req.full_slots[position]
    group = sc.state.groups[-1]  # the SWA group's last half where there is one
    slot = full_slot if group.group == 0 else int(sc.state.swa_mapping[full_slot])
    layer_words(group, layer)[slot, 1] ^= 1 << 21
    due = 0 if realkv == "all" else (layer - int(sc.state.layer_cursor[req.pool_index])) % LAYERS
    caught_at = None
    for step in range(LAYERS):
        run_both(sc, _ops())
        hits = [r for r in violations(sc.state) if r[6] & FINGERPRINT and r[2] == slot and r[3] == position]
        if hits and caught_at is None:
            caught_at = step
        sc.plan.prefix_lens[:2] += 1
    assert caught_at == due
    assert all(r[6] == FINGERPRINT for r in violations(sc.state))


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_small_batch_in_a_big_req_pool(device, layout):
    # sglang's req pool has thousands of rows; the kernels size their per-request plan by the batch, so
    # requests on rows far beyond the plan's width must check and write exactly as in a small pool.
    sc = make_scenario(layout, "partial", seed=13, num_reqs=3, max_bs=3, prefix_lens=[11, 0, 6],
                       extend_lens=[1, 9, 1], pool_rows=4097, swa_window=6, max_context=24,
                       full_slots=96, swa_slots=64, device=device)
    assert int(sc.plan.req_pool_indices[:3].max()) > 64
    run_both(sc, _ops())
    assert violations(sc.state) == []
    sc.plan.prefix_lens[:3] += sc.plan.extend_lens[:3]
    sc.plan.extend_lens[:3] = 0
    run_both(sc, _ops(), passes=("pre",))
    assert violations(sc.state) == []


@pytest.mark.parametrize("previous", [4, 40])
def test_the_last_sample_is_filed_under_the_last_forwards_rows(device, previous):
    # The last forward had `previous` rows (one of them graph padding, row 0) and its sampler staged one
    # token fewer than that; this pre-forward pass files them (40 rows: several plan-wide chunks for this
    # 5-wide batch), clears staging and leaves its own 5 rows. Both backends, same buffers after.
    sc = make_scenario("mha", "none", seed=19, num_reqs=3, max_bs=5, prefix_lens=[6, 0, 3], extend_lens=[1, 4, 1],
                       pool_rows=48, max_context=16, full_slots=64)
    state = sc.state
    cap = state.sampled_tokens.shape[0]
    rows = list(range(1, previous + 1))
    rows[1] = 0
    state.sample_rows = torch.zeros(cap + 1, dtype=torch.int64)
    state.sample_rows[:previous] = torch.tensor(rows)
    state.sample_rows[cap] = previous
    state.sample_staging = torch.full((cap,), -1, dtype=torch.int32)
    state.sample_staging[: previous - 1] = 100 + torch.arange(previous - 1, dtype=torch.int32)
    before = state.sampled_tokens.clone()
    sc = to_device(sc, device)
    _, ref = run_both(sc, _ops(), passes=("pre",))
    for name in ("sampled_tokens", "sample_staging", "sample_rows"):
        assert torch.equal(getattr(sc.state, name).cpu(), getattr(ref.state, name).cpu()), name
    want = before.clone()
    for j, row in enumerate(rows):
        if row:
            want[row] = 100 + j if j < previous - 1 else -1
    assert sc.state.sampled_tokens.cpu().tolist() == want.tolist()
    assert (sc.state.sample_staging.cpu() == -1).all()
    assert sc.state.sample_rows[:5].cpu().tolist() == sc.plan.req_pool_indices[:5].cpu().tolist()
    assert int(sc.state.sample_rows[cap]) == 5


@pytest.mark.parametrize("block", [8, 16, 128])
def test_long_write_matches_the_serial_chain(device, block):
    # One request writes 70 tokens after a 5-token prefix: with BLOCK 8, 9 chunks, the last composing
    # 64 earlier maps as 8 lanes x 8-map segments (uneven at the end); rows must be the serial chain's.
    sc = make_scenario("mla", "none", False, seed=5, num_reqs=1, max_bs=1, prefix_lens=[5], extend_lens=[70],
                       max_context=80, full_slots=96, device=device)
    run_both(sc, _ops(block))
    assert violations(sc.state) == []
    sc.plan.prefix_lens[:1] += sc.plan.extend_lens[:1]
    sc.plan.extend_lens[:1] = 0
    run_both(sc, _ops(block), passes=("pre",))
    assert violations(sc.state) == []


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_v_rows_that_differ_from_k_are_reported_identically(device, layout):
    # Corrupt only V rows (token, position, link of a few slots, one tile-first lane among them), so the
    # V half cannot lean on K's hash there, and a K row whose V twin stays intact.
    sc = make_scenario(layout, "none", True, seed=11, num_reqs=2, max_bs=3, prefix_lens=[21, 17], extend_lens=[1, 2],
                       swa_window=12, max_context=40, full_slots=128, swa_slots=96, share_prefix=False)
    r2t = sc.state.req_to_token
    v_groups = [g for g in sc.state.groups if g.half == 1]
    pool = int(sc.plan.req_pool_indices[0])
    for field, pos in ((0, 3), (1, 8), (2, 16), (2, 19)):
        slot = int(r2t[pool, pos])
        for g in v_groups:
            row_slot = slot if g.group == 0 else int(sc.state.swa_mapping[slot])
            if row_slot > 0:
                g.rows[row_slot, field] ^= 1 << 40
    sc.state.groups[0].rows[int(r2t[int(sc.plan.req_pool_indices[1]), 9]), 2] += 1
    sc = to_device(sc, device)
    run_both(sc, _ops())
    assert {r[1] for r in violations(sc.state)} >= {1, 0}


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_empty_and_disabled_batches(device, layout):
    sc = make_scenario(layout, "partial", seed=3, num_reqs=0, max_bs=4, device=device)
    run_both(sc, _ops())
    assert sc.state.counters.tolist() == [1, 1, 0, 0]
    sc = make_scenario(layout, "partial", seed=3, num_reqs=2, max_bs=4, device=device)
    sc.plan.enabled[0] = 0
    run_both(sc, _ops())
    assert sc.state.counters.tolist() == [0, 0, 0, 0]


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


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faults_reported_identically_with_the_right_reason(device, layout, fault):
    sc = make_scenario(layout, "partial", seed=21, num_reqs=3, max_bs=4, prefix_lens=[14, 9, 11],
                       extend_lens=[3, 1, 0], swa_window=6, max_context=40, full_slots=128, swa_slots=64, layers=3)
    target = inject(sc, fault)
    if target is None:
        pytest.skip(f"{fault} needs a layout with an SWA group; {layout} has none")
    sc = to_device(sc, device)
    run_both(sc, _ops())
    hits = [r for r in violations(sc.state) if (r[1], r[3], r[7]) == target.key]
    assert hits and hits[0][6] & EXPECTED_BITS[fault], (fault, target, violations(sc.state))


@pytest.mark.parametrize("form", ["prefix_is_end", "extend_const"])
def test_plans_given_as_end_lengths_or_a_fixed_extend_match(device, form):
    # sglang's draft-extend replay gives seq_lens (the end) instead of prefix lengths; decode and target
    # verify give one fixed extend length. Both must plan exactly what the (prefix, extend) form plans.
    extend = [3, 3, 3] if form == "extend_const" else [2, 1, 19]
    sc = make_scenario("swa", "partial", seed=7, num_reqs=3, max_bs=5, prefix_lens=[13, 9, 0], extend_lens=extend,
                       swa_window=6, max_context=48, full_slots=160, swa_slots=96, device=device)
    want = sc.clone()
    run_both(want, _ops())
    if form == "prefix_is_end":
        sc.plan.prefix_lens += sc.plan.extend_lens
        sc.plan.prefix_is_end = True
    else:
        sc.plan.extend_const = 3
        sc.plan.extend_lens = None
        # Padding rows now write the fixed length too: their junk tokens must sit in input_ids.
        sc.input_ids = torch.cat([sc.input_ids, sc.input_ids[:6]])
    got, _ = run_both(sc, _ops())
    assert_same(got.state, want.state)


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_draft_token_check_against_the_target_rows(device, layout):
    sc = make_scenario(layout, "none", seed=21, num_reqs=3, max_bs=4, prefix_lens=[14, 9, 11], extend_lens=[3, 1, 0],
                       token_offset=1, target_margin=1, swa_window=6, max_context=40, full_slots=128, swa_slots=64)
    run_both(to_device(sc.clone(), device), _ops())
    target = inject(sc, "wrong_token", seed=4)
    sc = to_device(sc, device)
    run_both(sc, _ops())
    hits = [r for r in violations(sc.state) if (r[1], r[3], r[7]) == target.key]
    assert hits and hits[0][6] == TOKEN


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_a_chain_step_s_plan_fields_match(device, layout):
    """A multi-layer EAGLE chain step's plan (plan.py ``_chain_step``, ``_draft_padding``): rows marked as padding
    (a negative mark; a prefix below min_prefix, as seq_lens at the fill value gives) neither verify nor write; the
    prefix's links are not checked; the target comparison covers the last position before the new ones only."""
    sc = make_scenario(layout, "partial", seed=33, num_reqs=4, max_bs=5, prefix_lens=[14, 9, 11, 12],
                       extend_lens=[4, 4, 4, 4], token_offset=1, target_margin=0, swa_window=6, max_context=48,
                       full_slots=160, swa_slots=96)
    inject(sc, "broken_link", seed=2)
    inject(sc, "wrong_token", seed=5)
    full = sc.clone()
    plan = sc.plan
    plan.prefix_links = False
    plan.target_window = 1
    plan.pad_mark = torch.tensor([1, -1, 2, 1, -1], dtype=torch.int32)  # row 1: padding by its mark
    plan.prefix_lens = plan.prefix_lens.clone()
    plan.prefix_lens[3] = -3  # row 3: padding by its length (seq_lens at the fill value 1, minus 4)
    plan.min_prefix = 0
    run_both(to_device(sc, device), _ops())
    assert int(sc.state.counters[3]) < int(full.plan.extend_lens[:4].sum()) * len(sc.state.groups)
    # The same batch with every row a request, every prefix link and position compared: it reports more.
    run_both(to_device(full, device), _ops())
    assert int(full.state.ring_count[0]) > int(sc.state.ring_count[0])


def test_ring_stays_bounded_when_violations_outnumber_it(device):
    sc = make_scenario("mha", "none", seed=9, num_reqs=2, max_bs=2, prefix_lens=[20, 20], extend_lens=[0, 0],
                       ring_size=4, share_prefix=False, device=device)
    sc.state.groups[0].rows[:, 1] += 1000
    big = make_scenario("mha", "none", seed=9, num_reqs=2, max_bs=2, prefix_lens=[20, 20], extend_lens=[0, 0],
                        ring_size=64, share_prefix=False)
    big.state.groups[0].rows[:, 1] += 1000
    reference.pre_forward(big.state, big.plan, big.input_ids)
    _ops().pre_forward(sc.state, sc.plan, sc.input_ids)
    assert int(sc.state.ring_count[0]) == int(big.state.ring_count[0]) == 40
    # Which of the records sharing a slot survives (and, as lanes race, which fields) is unspecified;
    # every stored field must still come from a real record.
    records = violations(big.state)
    for col in range(8):
        assert {row[col] for row in sc.state.ring.cpu().tolist()} <= {r[col] for r in records}


def test_state_without_counters_or_ring_still_runs(device):
    sc = make_scenario("mla", "none", seed=1, device=device)
    sc.state.ring = sc.state.ring_count = sc.state.counters = sc.state.group_verified = None
    _ops().pre_forward(sc.state, sc.plan, sc.input_ids)
    _ops().post_forward(sc.state, sc.plan)
    ref = make_scenario("mla", "none", seed=1)
    reference.pre_forward(ref.state, ref.plan, ref.input_ids)
    assert torch.equal(sc.state.groups[0].rows.cpu(), ref.state.groups[0].rows)


def test_mismatched_groups_are_a_clear_error(device):
    sc = make_scenario("mha", "none", v_half=True, seed=1, device=device)
    sc.state.layout = "mla"
    with pytest.raises(ValueError, match="mla"):
        _ops().pre_forward(sc.state, sc.plan, sc.input_ids)


def _with_status(sc, device):
    """Give the scenario's state the manager's layout: counters as views of one status vector, and a
    host-visible mirror (pinned host memory on CUDA, as the manager allocates it)."""
    state = sc.state
    status = torch.zeros(8, dtype=torch.int64, device=device)
    status[0:1] = state.ring_count
    status[1:5] = state.counters
    status[5:7] = state.group_verified
    state.status, state.ring_count, state.counters, state.group_verified = status, status[0:1], status[1:5], status[5:7]
    state.published = torch.full((8 + SLOTS,), -7, dtype=torch.int64, pin_memory=device == "cuda")
    state.publish_done = torch.zeros(1, dtype=torch.int64, device=device)
    return sc


SLOTS = 3  # packed-word slots of the mirror: pass number p publishes into slot p % SLOTS


def _published(status, packed_slots):
    """The mirror as the host must find it: the status, then the packed word of each pass that ran."""
    out = status.tolist() + [-7] * SLOTS
    for post_runs, ring_count in packed_slots:
        out[8 + post_runs % SLOTS] = (ring_count & 0xFFFFFFFF) | (post_runs << 32)
    return out


@pytest.mark.parametrize("layout,v_half", [("mha", True), ("mla", False), ("swa", True)])
@pytest.mark.parametrize("fault", [None, "remapped_req_to_token"])
def test_post_forward_publishes_the_status_for_the_host(device, layout, v_half, fault):
    sc = _with_status(make_scenario(layout, "partial", v_half, seed=3, num_reqs=3, max_bs=4, prefix_lens=[11, 7, 0],
                                    extend_lens=[1, 2, 9], swa_window=6, device=device), device)
    if fault:
        inject(sc, fault)
    ref = _with_status(to_device(sc.clone(), "cpu"), "cpu")
    ops = _ops()
    for state, plan, ids, pre, post in ((sc.state, sc.plan, sc.input_ids, ops.pre_forward, ops.post_forward),
                                        (ref.state, ref.plan, ref.input_ids, reference.pre_forward,
                                         reference.post_forward)):
        pre(state, plan, ids)
        assert state.published.tolist() == [-7] * (8 + SLOTS)  # the pre-forward pass publishes nothing
        post(state, plan)
    if device == "cuda":
        torch.cuda.synchronize()
    assert_same(sc.state, ref.state)
    for state in (sc.state, ref.state):
        status = state.status.cpu()
        assert state.published.tolist() == _published(status, [(int(status[2]), int(status[0]))])
        assert int(state.publish_done[0]) == 0  # reset for the next pass
    assert (int(sc.state.status[0]) > 0) == (fault is not None)


def test_a_disabled_post_forward_pass_still_publishes(device):
    sc = _with_status(make_scenario("mha", "none", seed=5, device=device), device)
    sc.plan.enabled.zero_()
    sc.state.status[2] = 41  # post_runs of earlier passes
    _ops().post_forward(sc.state, sc.plan)
    if device == "cuda":
        torch.cuda.synchronize()
    assert sc.state.published.tolist() == _published(sc.state.status.cpu(), [(41, 0)])


def test_each_post_forward_pass_publishes_into_its_own_slot(device):
    """Two passes: the second's packed word lands in the next slot, the first's stays for a host that
    reads late, so every pass's (violations, pass number) pair can be read."""
    sc = _with_status(make_scenario("mha", "none", seed=2, num_reqs=2, max_bs=2, prefix_lens=[6, 4],
                                    extend_lens=[1, 1], device=device), device)
    ops = _ops()
    words = []
    for _ in range(2):
        ops.pre_forward(sc.state, sc.plan, sc.input_ids)
        ops.post_forward(sc.state, sc.plan)
        if device == "cuda":
            torch.cuda.synchronize()
        words.append((int(sc.state.status[2]), int(sc.state.status[0])))
    assert [p for p, _ in words] == [1, 2]
    assert sc.state.published.tolist() == _published(sc.state.status.cpu(), words)

