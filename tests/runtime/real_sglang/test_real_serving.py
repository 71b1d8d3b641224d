"""The canary runtime installed on sglang 0.5.20's real pools, allocators and ForwardBatch objects, driven
through the wired phases (outside the graph, the bracketed model forward, ``flush``) on CPU with the torch
reference backend: clean serving reports nothing, and each injected fault is caught with its reason.

Real classes and what is built by hand: see ``harness.py``. Not loaded as released, each only where it
cannot load (see ``sglang_site.py``): torchvision's native part on a CPU torch, and on a CUDA machine
without them sglang's CUDA kernel packages ``sgl_kernel`` and ``flashinfer``, which these tests never call.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from canary_instrument.runtime import mark_init_finished

from .harness import RealRunner, Scheduler

LAYOUTS = ["mha", "mla", "swa"]
# The `dev` fixture (tests/runtime/conftest.py): "cpu" with the torch reference backend everywhere, and
# "cuda" with the Triton kernels where a GPU is visible. Overridden here: sglang chooses its kernels when it
# is imported, by the platform it sees (`is_cuda()`), so where a GPU is visible its pools and batches call
# CUDA-only ops, which have no CPU implementation; its CPU paths run on machines without one (CI).


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def dev(request):
    if request.param == "cpu" and torch.cuda.is_available():
        pytest.skip("sglang imported where a GPU is visible runs CUDA-only ops; its CPU paths run without a GPU")
    return request.param


@pytest.fixture(scope="module")
def server_args(sg):
    """Real ``ServerArgs`` from sglang's own parser, as ``python -m sglang.launch_server ...`` builds them."""
    parser = argparse.ArgumentParser()
    sg.server_args.ServerArgs.add_cli_args(parser)

    def build(*cli):
        return sg.server_args.ServerArgs.from_cli_args(parser.parse_args(["--model-path", "unused", *cli]))

    return build


def _serving(sg, server_args, layout, *cli, dev="cpu", **runner_kw):
    args = server_args("--kv-canary", "log", "--kv-canary-real-data", "partial", *cli)
    runner = RealRunner(sg, args, layout, device=dev, **runner_kw)
    mark_init_finished(runner.canary_manager)
    return runner, Scheduler(sg, runner)


def _prefill_and_decode(sched, prompts, steps):
    reqs = [sched.new_request(p) for p in prompts]
    next_tokens = sched.step(sched.extend(reqs))
    for _ in range(steps):
        next_tokens = sched.step(sched.decode(reqs, next_tokens))
    return reqs, next_tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_clean_serving_reports_nothing(sg, server_args, layout, dev):
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    manager = runner.canary_manager
    assert manager is not None
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8, 9], [11, 12, 13]], steps=3)
    # Chunked prefill: a long prompt in three chunks, then decoded beside the others.
    long = sched.new_request(list(range(20, 42)))
    for _ in range(3):
        tail = sched.step(sched.extend([long], chunk=8))
    reqs.append(long)
    next_tokens.append(tail[0])
    for _ in range(12):  # past the SWA window of 8: the allocator releases out-of-window SWA slots
        next_tokens = sched.step(sched.decode(reqs, next_tokens))
    # A finished request's row and slots go back to the real pool and allocator and are reused.
    sched.finish(reqs.pop(0))
    newcomer = sched.new_request([3, 1, 4, 1, 5, 9, 2, 6])
    tail = sched.step(sched.extend([newcomer]))
    reqs.append(newcomer)
    next_tokens = next_tokens[1:] + tail
    for _ in range(4):
        next_tokens = sched.step(sched.decode(reqs, next_tokens))
    assert manager.flush() == []
    stats = manager.stats()
    assert stats.violations == 0
    assert stats.steps == 1 + 3 + 3 + 12 + 1 + 4
    assert stats.tokens_protected == sum(len(r.slots) for r in reqs) + 5 + 3 + 12  # incl. the finished request
    assert stats.verified > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eagle_draft_steps_on_the_draft_runner_report_nothing(sg, server_args, layout, dev):
    # A draft runner: its manager has speculative_num_steps - 1 sub-forwards, driven by the EAGLE worker's sites.
    runner, sched = _serving(
        sg, server_args, layout, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3", dev=dev, is_draft_worker=True,
    )
    manager = runner.canary_manager
    assert manager.num_single_forward == 2
    target = [[3, 1, 4, 1, 5, 9], [2, 7, 1, 8]]
    reqs = [sched.new_request(t[1:]) for t in target]  # a draft slot p holds the token of position p + 1
    batch = sched.extend(reqs)
    with runner.canary_manager.with_ops_outside_graph([0], batch), manager.with_active_single_forward_manager(0):
        runner.model.forward(batch.input_ids, batch.positions, batch)
    for round_ in range(3):
        sched.draft_round(reqs, 2, guesses=[[50 + round_, 60 + round_]] * 2)
    assert manager.flush() == []
    assert manager.stats().pre_runs == 1 + 3 * 2


def _violations(manager):
    found = manager.flush()
    assert found, "the fault was not caught"
    return found


@pytest.mark.parametrize("layout", LAYOUTS)
def test_remapped_req_to_token_entry_is_caught(sg, server_args, layout, dev):
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8, 9, 10]], steps=1)
    (stray,) = sched.alloc(1)
    runner.req_to_token_pool.req_to_token[reqs[0].row, 4] = stray  # a wrong pointer, as a scheduler bug writes
    reqs[0].slots[4] = stray
    sched.step(sched.decode(reqs, next_tokens))
    found = _violations(runner.canary_manager)
    # The stray slot's row is not position 4's (a fresh slot: nothing wrote it); position 5's link no longer
    # follows from its predecessor.
    by_position = {}
    for v in found:
        by_position.setdefault(v.position, set()).update(v.reasons)
    assert by_position == {4: {"position", "link", "unwritten"}, 5: {"link"}}
    assert {v.req_pool_index for v in found} == {reqs[0].row}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_use_after_free_is_caught(sg, server_args, layout, dev):
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8, 9, 10]], steps=1)
    victim = reqs[0].slots[2]
    # The bug: a slot still referenced by a running request goes back to the allocator ...
    sched.allocator.free(sched.tensor([victim]))
    # ... and the allocator hands it to the next request, whose prefill writes over it.
    _hand_out_next(sched, victim)
    other = sched.new_request([70])
    other.slots = [victim]
    sched._map([other])
    fm = sg.forward_batch_info
    prefix, new = sched.tensor([0], torch.int32), sched.tensor([1], torch.int32)
    positions, start = fm.compute_position_torch(prefix, new)
    batch = sched._batch([other], fm.ForwardMode.EXTEND, [70], [victim], positions=positions,
                         extend_prefix_lens=prefix, extend_seq_lens=new, extend_start_loc=start, extend_num_tokens=1)
    sched.step(batch)
    sched.step(sched.decode(reqs, next_tokens))
    found = [v for v in _violations(runner.canary_manager) if v.req_pool_index == reqs[0].row]
    if layout == "swa":  # the reused slot came with a fresh SWA peer, whose row is the other request's too
        assert {v.position for v in found if v.group == "swa"} == {2, 3}  # its row, and the link after it
    by_position = {}
    for v in found:
        if v.group == "full":
            by_position.setdefault((v.position, v.slot), set()).update(v.reasons)
    # The victim slot now holds the other request's row; the next position's link breaks with it.
    assert by_position == {(2, victim): {"position", "link"}, (3, reqs[0].slots[3]): {"link"}}


def _hand_out_next(sched, slot):
    """Take ``slot`` off the real allocator the way its next alloc() would (it was freed last, so it is handed
    out after every other free slot): drain the free list, keep ``slot``, return the rest. On SWA the full
    slot is paired with an SWA slot as SWATokenToKVPoolAllocator.alloc() pairs them."""
    full = getattr(sched.allocator, "full_attn_allocator", sched.allocator)
    drained = full.alloc(full.available_size()).tolist()
    assert drained[-1] == slot
    full.free(sched.tensor(drained[:-1]))
    if full is not sched.allocator:
        swa = sched.allocator.swa_attn_allocator.alloc(1)
        sched.allocator.set_full_to_swa_mapping(sched.tensor([slot]), swa)


def _kv_layer0(runner, layout):
    pool = runner.token_to_kv_pool
    if layout == "mla":
        return pool.kv_buffer[0]
    if layout == "swa":
        return pool.full_kv_pool.k_buffer[0]
    return pool.k_buffer[0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_flipped_real_kv_byte_is_caught(sg, server_args, layout, dev):
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8, 9, 10]], steps=1)
    slot = reqs[0].slots[3]
    _kv_layer0(runner, layout)[slot].view(torch.uint8).view(-1)[1] ^= 0x10  # inside the fingerprinted 16 bytes
    sched.step(sched.decode(reqs, next_tokens))
    found = _violations(runner.canary_manager)
    assert {(v.slot, v.position) for v in found} == {(slot, 3)}
    assert all(v.reasons == {"fingerprint"} for v in found)


@pytest.mark.parametrize("layout", ["mha"])
def test_swapped_next_tokens_are_caught(sg, server_args, layout, dev):
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8], [11, 12, 13, 14]], steps=1)
    # The bug: the two requests' sampled tokens are appended to each other's sequence.
    sched.step(sched.decode(reqs, next_tokens[::-1]))
    sched.step(sched.decode(reqs, [1, 2]))
    found = _violations(runner.canary_manager)
    assert any("token" in v.reasons for v in found)


def test_corrupted_swa_mapping_is_caught(sg, server_args, dev):
    runner, sched = _serving(sg, server_args, "swa", dev=dev)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8, 9, 10]], steps=1)
    mapping = runner.token_to_kv_pool_allocator.full_to_swa_index_mapping
    unmapped, remapped = reqs[0].slots[5], reqs[0].slots[4]
    mapping[unmapped] = 0  # an in-window position that lost its SWA slot
    (spare,) = sched.allocator.swa_attn_allocator.alloc(1).tolist()
    mapping[remapped] = spare  # another pointing at an SWA slot it never wrote
    sched.step(sched.decode(reqs, next_tokens))
    found = [v for v in _violations(runner.canary_manager) if v.group == "swa"]
    by_position = {v.position: v.reasons for v in found}
    assert "swa_unmapped" in by_position[5]
    assert {"position", "link"} & by_position[4]


def test_raise_mode_raises_on_a_real_pool(sg, server_args, dev):
    from canary_instrument.runtime import CanaryViolationError

    args = server_args("--kv-canary", "raise")
    runner = RealRunner(sg, args, "mha", device=dev)
    mark_init_finished(runner.canary_manager)
    sched = Scheduler(sg, runner)
    reqs, next_tokens = _prefill_and_decode(sched, [[5, 6, 7, 8]], steps=1)
    reqs[0].slots[1] = sched.alloc(1)[0]  # the scheduler's bug: a wrong slot for position 1
    with pytest.raises(CanaryViolationError):
        # Raised one step late, from the step that reads the faulty step's results (or from flush()).
        for _ in range(2):
            next_tokens = sched.step(sched.decode(reqs, next_tokens))


def test_canary_off_by_default_on_real_server_args(sg, server_args, dev):
    runner = RealRunner(sg, server_args(), "mha", device=dev)
    assert runner.canary_manager is None
    sched = Scheduler(sg, runner)
    _prefill_and_decode(sched, [[5, 6, 7]], steps=2)  # the wiring's null contexts: serving is unchanged


def test_manager_answers_what_sglang_calls_outside_the_sites(sg, server_args, dev):
    runner, _ = _serving(sg, server_args, "mha", dev=dev)
    manager = runner.canary_manager
    assert manager.per_forward_workspace_bytes() >= 0


def test_draft_extend_after_verify_on_the_draft_runner(sg, server_args, dev):
    runner, sched = _serving(
        sg, server_args, "mha", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3", dev=dev, is_draft_worker=True,
    )
    reqs = [sched.new_request([1, 4, 1, 5, 9])]
    batch = sched.extend(reqs)
    with runner.canary_manager.with_ops_outside_graph([0], batch), \
            runner.canary_manager.with_active_single_forward_manager(0):
        runner.model.forward(batch.input_ids, batch.positions, batch)
    # After a verify accepted two tokens, the draft model extends over them in DRAFT_EXTEND_V2 mode.
    reqs[0].tokens += [2, 6]
    after = sched.extend(reqs)
    after.forward_mode = sg.forward_batch_info.ForwardMode.DRAFT_EXTEND_V2
    with runner.canary_manager.with_ops_outside_graph([0], after), \
            runner.canary_manager.with_active_single_forward_manager(0):
        runner.model.forward(after.input_ids, after.positions, after)
    assert runner.canary_manager.flush() == []


def _multi_layer_eagle(sg, server_args, dev, *cli):
    """A Step-3.5-shaped multi-layer EAGLE engine on real classes: an SWA target, and one draft runner per chain step
    whose pool is an SWA pool of one sliding layer and a full half of none, sharing the target's req-pool rows and
    SWA allocator, installed in chain order. Nothing ends the drafts' init (the worker has no such hook)."""
    args = server_args("--kv-canary", "log", "--kv-canary-real-data", "partial", "--speculative-algorithm", "EAGLE",
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4", *cli)
    target = RealRunner(sg, args, "swa", device=dev, window=16)
    drafts = [RealRunner(sg, args, "mtp", device=dev, window=16, is_draft_worker=True, target=target) for _ in range(3)]
    mark_init_finished(target.canary_manager)
    return target, drafts, Scheduler(sg, target)


def _rotated(ids, new, at=None):
    out = list(ids[1:]) + [ids[-1]]
    out[len(ids) - 1 if at is None else at] = new
    return out


def _mtp_round(sg, sched, drafts, reqs, last, guesses, accepted, bonus, swap_first=False, pad_with=()):
    """A target verify of [last, guesses], then each chain step's bare draft forward over the verified positions in
    DRAFT_EXTEND_V2 mode (sglang's eager draft-extend: ``draft_runner_list[step].forward``). ``pad_with``: requests
    whose req-pool rows pad the draft-extend batch the way sglang 0.5.17's draft-extend graph pads its static one
    (``fill_draft_extend_prepare_buffers_kernel``): the stale index kept, seq_lens at the fill value 1, the accept
    count -1, ids, positions and slots 0."""
    fm = sg.forward_batch_info
    width = len(guesses[0]) + 1
    ids = [[t] + g for t, g in zip(last, guesses)]
    if swap_first:
        ids[0][0], ids[1][0] = ids[1][0], ids[0][0]
    sched._evict(reqs)
    cached = [len(r.slots) for r in reqs]
    locs = []
    for r, i in zip(reqs, ids):
        slots = sched.alloc(width)
        r.slots += slots
        r.tokens += i
        locs += slots
    sched._map(reqs)
    positions = sched.tensor([p for n in cached for p in range(n, n + width)])
    verify = sched._batch(reqs, fm.ForwardMode.TARGET_VERIFY, [t for i in ids for t in i], locs, positions=positions)
    verify.seq_lens, verify.seq_lens_cpu = sched.tensor(cached), torch.tensor(cached)
    verify.spec_info = argparse.Namespace(draft_token_num=width)
    sched.runner.forward(verify)
    segments = [g[:a] + [b] + [200 + j for j in range(width - 1 - a)] for g, a, b in zip(guesses, accepted, bonus)]
    for step, draft in enumerate(drafts):
        if step:
            segments = [_rotated(s, 300 + step, at=a) for s, a in zip(segments, accepted)]
        pad, n_pad = [0] * (width * len(pad_with)), len(pad_with)
        extend = sched._batch(reqs, fm.ForwardMode.DRAFT_EXTEND_V2, [t for s in segments for t in s] + pad,
                              locs + pad, positions=torch.cat([positions, sched.tensor(pad)]),
                              extend_seq_lens=sched.tensor([width] * (len(reqs) + n_pad), torch.int32))
        extend.batch_size = len(reqs) + n_pad
        extend.req_pool_indices = sched.tensor([r.row for r in [*reqs, *pad_with]])
        extend.seq_lens = sched.tensor([n + width for n in cached] + [1] * n_pad)
        extend.spec_info = argparse.Namespace(
            num_accept_tokens=sched.tensor([a + 1 for a in accepted] + [-1] * n_pad, torch.int32))
        draft.forward(extend)
    for r, n, a in zip(reqs, cached, accepted):
        del r.tokens[n + 1 + a:]
        sched.allocator.free(sched.tensor(r.slots[n + 1 + a:]))
        r.slots = r.slots[: n + 1 + a]
    return list(bonus)


def _mtp_prefill(sched, drafts, reqs):
    prefill = sched.extend(reqs)
    sampled = sched.step(prefill)
    segments = [r.tokens[1:] + [s] for r, s in zip(reqs, sampled)]
    for step, draft in enumerate(drafts):  # the chain's draft-extend of the prefill, bare forwards
        if step:
            segments = [_rotated(s, 300 + step) for s in segments]
        draft.forward(dataclasses.replace(prefill, input_ids=sched.tensor([t for s in segments for t in s])))
    return sampled


def test_multi_layer_eagle_drafts_on_real_pools_follow_their_target(sg, server_args, dev):
    """sglang's multi-layer EAGLE worker wires no site for its draft runners and ends none's init: they follow their
    target (which ends their init at its first step end), are checked on sglang's real pools, and stay clean; a
    swapped verify input is caught by the first chain step at the last position before its draft-extend."""
    target, drafts, sched = _multi_layer_eagle(sg, server_args, dev)
    managers = [d.canary_manager for d in drafts]
    assert managers[0].state.target_rows is target.canary_manager.state.groups[0].rows
    assert [m.state.target_rows for m in managers[1:]] == [None, None] and all(m.is_chain_step for m in managers)
    reqs = [sched.new_request([3, 1, 4, 1, 5]), sched.new_request([9, 2, 6, 5, 3, 5])]
    last = _mtp_prefill(sched, drafts, reqs)
    for round_, accepted in enumerate([(1, 0), (3, 2), (0, 0)]):
        last = _mtp_round(sg, sched, drafts, reqs, last, [[20 + round_] * 3, [50 + round_] * 3], accepted,
                          [40 + round_, 70 + round_], swap_first=round_ == 2)
    sched.step(sched.decode(reqs, last))  # a target step end reads the last draft-extend
    found = managers[0].flush()
    assert target.canary_manager.flush() == [] and [m.flush() for m in managers[1:]] == [[], []]
    assert all(m.follows_target and m.stats().pre_runs == 4 for m in managers)
    assert all(m.stats().verified > 0 for m in managers)
    # Round 2's verify (at 5 + 2 + 4 and 6 + 1 + 3 cached positions) got the requests' first inputs (round 1's bonus
    # tokens) swapped: the first chain step's comparison reports both, in its FULL group (rows kept, no layers) at the
    # target's row, the target's token as stored, and in its SWA group at its own row of the position before.
    assert {v.reasons for v in found} == {frozenset({"token"})}
    assert {(v.group, v.req_pool_index, v.position, v.stored, v.expected) for v in found} == {
        ("full", reqs[0].row, 11, 71, 41), ("full", reqs[1].row, 10, 41, 71),
        ("swa", reqs[0].row, 10, 41, 71), ("swa", reqs[1].row, 9, 71, 41)}


def test_real_draft_extend_padding_with_a_stale_live_index_is_not_a_request(sg, server_args, dev):
    """A draft-extend batch padded as sglang 0.5.17's graph pads it: the padded row keeps request 1's live req-pool
    index, seq_lens 1 and accept count -1. No chain step writes over request 1's rows or reports."""
    target, drafts, sched = _multi_layer_eagle(sg, server_args, dev)
    managers = [d.canary_manager for d in drafts]
    reqs = [sched.new_request([3, 1, 4, 1, 5]), sched.new_request([9, 2, 6, 5, 3, 5])]
    last = _mtp_prefill(sched, drafts, reqs)
    last = _mtp_round(sg, sched, drafts, reqs, last, [[20] * 3, [50] * 3], (1, 0), [40, 70])
    before = [[g.rows[sched.tensor(reqs[1].slots[:2])].clone() for g in m.state.groups] for m in managers]
    _mtp_round(sg, sched, drafts, reqs[:1], last[:1], [[21] * 3], (2,), [41], pad_with=reqs[1:])
    last = _mtp_round(sg, sched, drafts, reqs, [41, last[1]], [[22] * 3, [51] * 3], (0, 1), [42, 71])
    sched.step(sched.decode(reqs, last))
    assert target.canary_manager.flush() == [] and [m.flush() for m in managers] == [[], [], []]
    for m, rows in zip(managers, before):
        assert all(torch.equal(g.rows[sched.tensor(reqs[1].slots[:2])], r) for g, r in zip(m.state.groups, rows))


def test_a_batch_the_plan_stream_prepared_is_told_apart(sg, server_args, dev):
    """The write_slot perturbation leaves alone a forward prepared before its site: sglang's own ForwardBatch says so
    once ``mark_forward_metadata_ready()`` (eagle_prepare_for_verify, after loading the verify graph's buffers)."""
    from canary_instrument.runtime.perturb.batch import planned_before_the_forward

    _, sched = _serving(sg, server_args, "mha", dev=dev)
    batch = sched.extend([sched.new_request([1, 2, 3])])
    assert not planned_before_the_forward(batch)
    batch.mark_forward_metadata_ready()
    assert planned_before_the_forward(batch)
