"""Expected tokens from device data only: the target's sampled-token table and the EAGLE draft's
check against the target's rows. No host token lists reach the runtime."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import profile

from canary_instrument.runtime import mark_init_finished
from canary_instrument.runtime.reports.summary import SummaryLine
from canary_instrument.runtime.step.plan import plan_from_batch

from .mini_engine import ForwardMode, MiniRunner, Scheduler, draft_step_batches, server_args


def _serving(dev, **args):
    runner = MiniRunner(server_args(**args), device=dev, max_context=64)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    return runner, sched


def test_swapped_next_tokens_are_caught_on_the_step(dev):
    runner, sched = _serving(dev)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7])]
    runner.forward_and_sample(sched.extend(reqs), [50, 60])
    batch = sched.decode(reqs, [50, 60])
    batch.input_ids = batch.input_ids.flip(0)  # the model is fed each other's sampled token
    runner.forward(batch)
    found = runner.canary_manager.flush()
    assert found and {v.reasons for v in found} == {frozenset({"token"})}
    assert {v.kernel for v in found} == {"post_forward"}  # caught when verifying this step's writes
    assert {(v.req_pool_index, v.position, v.stored, v.expected) for v in found} == {
        (reqs[0].row, 3, 60, 50),
        (reqs[1].row, 4, 50, 60),
    }


def test_a_stale_token_fed_back_is_caught(dev):
    runner, sched = _serving(dev)
    req = sched.new_request([1, 2, 3])
    runner.forward_and_sample(sched.extend([req]), [7])
    runner.forward_and_sample(sched.decode([req], [7]), [8])
    runner.forward(sched.decode([req], [7]))  # the previous step's token again, not the sampled 8
    found = runner.canary_manager.flush()
    assert {(v.position, v.stored, v.expected, v.reasons) for v in found} == {(4, 7, 8, frozenset({"token"}))}


def test_without_the_token_check_a_swap_goes_unseen(dev):
    runner, sched = _serving(dev, kv_canary_token_check=False)
    assert runner.canary_manager.state.sampled_tokens is None
    assert "sample" not in vars(runner)  # the sampler is not wrapped
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7])]
    runner.forward_and_sample(sched.extend(reqs), [50, 60])
    batch = sched.decode(reqs, [50, 60])
    batch.input_ids = batch.input_ids.flip(0)
    runner.forward(batch)
    assert runner.canary_manager.flush() == []


def test_a_chunked_prefills_discarded_sample_is_never_checked(dev):
    runner, sched = _serving(dev)
    prompt = [11, 12, 13, 14, 15, 16]
    req = sched.new_request(prompt[:3])
    runner.forward_and_sample(sched.extend([req]), [99])  # chunk 1: the engine discards this sample
    req.tokens = list(prompt)
    runner.forward_and_sample(sched.extend([req]), [40])  # chunk 2 writes prompt[3] where 99 was sampled
    runner.forward_and_sample(sched.decode([req], [40]), [41])
    runner.forward(sched.decode([req], [41]))
    assert runner.canary_manager.flush() == []
    assert runner.canary_manager.stats().written == 2 * 8


def test_an_entry_is_consumed_by_the_next_forward_of_its_row(dev):
    runner, sched = _serving(dev, speculative_num_steps=3)
    old = sched.new_request([1, 2, 3])
    runner.forward_and_sample(sched.extend([old]), [70])  # sampled, then the request finishes
    sched.finish(old)
    free_rows = runner.req_to_token_pool.free
    free_rows.insert(0, free_rows.pop(free_rows.index(old.row)))
    new = sched.new_request([4, 5, 6])
    assert new.row == old.row
    runner.forward(sched.extend([new]))  # a new owner's extend, with no sample after it
    runner.forward(sched.decode([new], [9]))  # position 3 again: the old entry (70) must be gone
    table = runner.canary_manager.state.sampled_tokens
    assert int(table[new.row]) == -1
    # A target verify (EAGLE decodes through it, not through the sampler) consumes the entry too.
    runner.forward_and_sample(sched.decode([new], [10]), [80])
    verify, _ = _target_verify(sched, [new], [[81, 82, 83]])
    runner.forward(verify)
    runner.forward(sched.decode([new], [90]))
    assert runner.canary_manager.flush() == []


def _target_verify(sched, reqs, drafts):
    cached = [len(r.slots) for r in reqs]
    ids, pos, locs = [], [], []
    for r, d in zip(reqs, drafts):
        slots = sched._alloc(len(d))
        pos += list(range(len(r.slots), len(r.slots) + len(d)))
        r.slots += slots
        locs += slots
        ids += d
        r.tokens += d
    sched._map(reqs)
    batch = sched._batch(reqs, ForwardMode.TARGET_VERIFY, ids, pos, locs)
    batch.seq_lens = torch.tensor(cached, device=sched.device)
    batch.spec_info = SimpleNamespace(draft_token_num=len(drafts[0]))
    return batch, cached


def test_the_sampler_wrap_costs_one_device_op(dev):
    runner, sched = _serving(dev)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    batch = sched.extend(reqs)
    runner.forward(batch)
    runner.sample(torch.tensor([1, 1], dtype=torch.int32, device=dev), batch)  # the first of a size makes its view
    next_ids = torch.tensor([5, 6], dtype=torch.int32, device=dev)
    with profile() as prof:
        runner.sample(next_ids, batch)
    ops = [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    assert ops == ["aten::copy_"]
    state = runner.canary_manager.state
    assert state.sample_staging[:2].tolist() == [5, 6]  # staged in the batch's order
    # The next forward's pre-forward pass files them under the rows the sampled forward left.
    assert state.sample_rows[:2].tolist() == [r.row for r in reqs] and int(state.sample_rows[-1]) == 2
    manager = runner.canary_manager
    decode = sched.decode(reqs, [5, 6])
    manager.ops.pre_forward(state, plan_from_batch(decode, manager.enabled), decode.input_ids)
    assert state.sampled_tokens[[r.row for r in reqs]].tolist() == [5, 6]
    assert state.sample_staging[:2].tolist() == [-1, -1]


# ---------------------------------------------------------------------- EAGLE draft worker

STEPS = 3  # speculative_num_steps: two draft sub-forwards, three draft tokens per verify


class Eagle:
    """A target runner and a draft runner sharing req_to_token and slot numbers, as EAGLE's do."""

    def __init__(self, dev, draft_init=True, **args):
        args = server_args(speculative_num_steps=STEPS, **args)
        self.target = MiniRunner(args, device=dev, size=512, max_context=64)
        self.draft = MiniRunner(args, device=dev, size=512, max_context=64, is_draft_worker=True,
                                req_to_token_pool=self.target.req_to_token_pool)
        self.sched = Scheduler(self.target)
        self.dev = dev
        for runner in (self.target, self.draft) if draft_init else (self.target,):
            mark_init_finished(runner.canary_manager)

    def prefill(self, prompts, sampled, rotate=True):
        """Target extend + sample, then the draft-extend over the same positions with ids rotated by one.
        The sampled tokens are not in the cache yet: they are the next verify's first inputs."""
        reqs = [self.sched.new_request(p) for p in prompts]
        batch = self.sched.extend(reqs)
        self.target.forward_and_sample(batch, sampled)
        ids = []
        for r, s in zip(reqs, sampled):
            known = r.tokens + [s]
            ids += known[1:] if rotate else known[:-1]
        self._draft_extend(dataclasses.replace(batch, forward_mode=ForwardMode.DRAFT_EXTEND,
                                               input_ids=torch.tensor(ids, device=self.dev)))
        return reqs

    def _draft_extend(self, batch):
        manager = self.draft.canary_manager
        with manager.with_ops_outside_graph([0], batch), manager.with_active_single_forward_manager(0):
            self.draft.model.forward(batch.input_ids, batch.positions, batch)

    def draft_chain(self, reqs):
        """The multi-step draft: STEPS - 1 forwards writing positions c, c + 1 (c = cached length)."""
        manager = self.draft.canary_manager
        outer, steps = draft_step_batches(self.sched, reqs, STEPS - 1, [[100 + i for i in range(STEPS - 1)]] * len(reqs))
        with manager.with_ops_outside_graph(range(STEPS - 1), outer):
            for i, step in enumerate(steps):
                with manager.with_active_single_forward_manager(i):
                    self.draft.model.forward(step.input_ids, step.positions, step)
        for r in reqs:  # the chain's slots are released; verify allocates its own
            self.sched.free_slots += r.slots[-(STEPS - 1):]
            r.slots = r.slots[: -(STEPS - 1)]


def _eagle_round(e, reqs, last, drafts, accepted, bonus, swap_first=False):
    """One EAGLE decode step after the draft chain: verify [last, drafts] on the target, keep
    ``accepted`` drafts plus ``bonus``, draft-extend the verified positions; returns the new last tokens."""
    sched = e.sched
    ids = [[t] + d for t, d in zip(last, drafts)]
    if swap_first:
        ids[0][0], ids[1][0] = ids[1][0], ids[0][0]
    verify, cached = _target_verify(sched, reqs, ids)
    e.target.forward(verify)
    # Target predictions: the accepted drafts, the bonus, then whatever follows a rejection.
    predicts = [d[:a] + [b] + [200 + j for j in range(len(d) - a)] for d, a, b in zip(drafts, accepted, bonus)]
    extend = dataclasses.replace(
        verify, forward_mode=ForwardMode.DRAFT_EXTEND, seq_lens=verify.seq_lens + STEPS,
        input_ids=torch.tensor([t for p in predicts for t in p], device=e.dev),
        extend_prefix_lens=None, extend_seq_lens=torch.full((len(reqs),), STEPS, device=e.dev),
        num_tokens_per_req=STEPS, spec_info=None,
    )
    e._draft_extend(extend)
    for r, n, a in zip(reqs, cached, accepted):
        del r.tokens[n + 1 + a :]  # verify appended [last, drafts]; keep last + the accepted ones
        sched.free_slots += r.slots[n + 1 + a :]
        r.slots = r.slots[: n + 1 + a]
    return list(bonus)  # not in the cache yet: the next verify's first inputs


def test_eagle_rounds_with_partial_acceptance_stay_clean(dev):
    e = Eagle(dev)
    assert e.draft.canary_manager.state.target_rows is e.target.canary_manager.state.groups[0].rows
    reqs = e.prefill([[1, 2, 3, 4], [5, 6, 7, 8, 9]], [10, 11])
    last = [10, 11]
    for round_, accepted in enumerate([(2, 0), (0, 1), (1, 2), (2, 2)]):
        e.draft_chain(reqs)
        drafts = [[30 + 3 * round_ + j for j in range(STEPS - 1)], [60 + 3 * round_ + j for j in range(STEPS - 1)]]
        last = _eagle_round(e, reqs, last, drafts, accepted, [40 + round_, 70 + round_])
    assert e.draft.canary_manager.flush() == [] and e.target.canary_manager.flush() == []
    assert e.draft.canary_manager.stats().pre_runs == 1 + 4 * (STEPS - 1) + 4


def test_draft_extend_without_the_rotation_is_caught(dev):
    e = Eagle(dev)
    reqs = e.prefill([[1, 2, 3, 4, 5, 6]], [7], rotate=False)  # draft slot p gets token p, not p + 1
    e.draft_chain(reqs)
    found = e.draft.canary_manager.flush()
    assert found and {v.reasons for v in found} == {frozenset({"token"})}
    assert {v.kernel for v in found} == {"pre_forward"}
    # Draft positions 0..4 are checked against the target's rows 1..5 (row 5's token 6 sits at draft
    # position 5, whose target row 6 does not exist yet), each reported at the target's row: its token
    # stored, the draft's expected (a disagreement names no culprit; docs/runtime.md, "EAGLE").
    assert sorted({(v.position, v.stored, v.expected) for v in found}) == [(p, p + 1, p) for p in range(1, 6)]
    slots = {reqs[0].slots[p] for p in range(1, 6)}
    assert {v.slot for v in found} == slots


def test_a_swapped_verify_input_is_caught_through_the_draft_rows(dev):
    e = Eagle(dev)
    reqs = e.prefill([[1, 2, 3, 4], [5, 6, 7, 8, 9]], [10, 11])
    e.draft_chain(reqs)
    _eagle_round(e, reqs, [10, 11], [[20, 21], [50, 51]], (1, 1), [30, 60], swap_first=True)
    found = e.draft.canary_manager.flush()
    assert e.target.canary_manager.flush() == []  # the target's own rows are consistent
    # The draft's row of position n - 1 holds the sampled token n; the target's row n got the other request's,
    # and that is where it is reported: the request, position and slot the swapped token landed at.
    assert {(v.req_pool_index, v.position, v.stored, v.expected) for v in found} == {
        (reqs[0].row, 4, 11, 10),
        (reqs[1].row, 5, 10, 11),
    }
    assert {(v.req_pool_index, v.slot) for v in found} == {(reqs[0].row, reqs[0].slots[4]), (reqs[1].row, reqs[1].slots[5])}
    assert {v.reasons for v in found} == {frozenset({"token"})}
    # ...and at the step it landed in: the target's verify (the draft's reports carry the target's step numbers).
    assert {v.step for v in found} == {e.target.canary_manager.step} != {e.draft.canary_manager.step}


def test_a_draft_s_flood_is_summarised_per_interval_of_target_steps(dev, canary_log):
    """The draft runs several forwards per target step and reports in target steps: its summary interval
    counts target steps too, so a flood lasting many steps is summarised once an interval, not at every
    draft forward once the draft's own count has run ahead of the target's."""
    e = Eagle(dev, kv_canary_summary_interval=3)
    reqs = e.prefill([[1, 2, 3, 4, 5, 6]], [7], rotate=False)  # every later draft forward re-reads the bad rows
    last = [7]
    for round_ in range(12):
        e.draft_chain(reqs)
        last = _eagle_round(e, reqs, last, [[30 + 3 * round_ + j for j in range(STEPS - 1)]], (1,), [90 + round_])
    e.draft.canary_manager.flush()
    summaries = SummaryLine.find_all(canary_log.text)
    target_steps = e.target.canary_manager.step
    assert e.draft.canary_manager.step > target_steps  # the draft's own count ran ahead
    assert summaries and max(s.last_step for s in summaries) <= target_steps
    assert len(summaries) <= target_steps // 3 + 1
    assert all(s.last_step - s.first_step >= 2 for s in summaries[:-1])


def test_a_draft_whose_worker_never_ends_its_init_is_checked_from_its_target_s_first_step(dev):
    """sglang's multi-layer EAGLE worker never calls mark_init_finished on its draft runners: their canary
    starts with the first draft forward after the target has served a step, and catches what it should."""
    e = Eagle(dev, draft_init=False)
    draft = e.draft.canary_manager
    e._draft_extend(e.sched.extend([e.sched.new_request([1, 2, 3])]))  # before any target step: warm-up
    assert not draft.init_finished
    reqs = e.prefill([[1, 2, 3, 4, 5, 6]], [7], rotate=False)  # the target's first step, then the draft's extend
    assert draft.init_finished
    e.draft_chain(reqs)
    found = draft.flush()
    assert found and {v.reasons for v in found} == {frozenset({"token"})}


def test_a_draft_runner_without_a_target_has_no_token_check(dev, canary_log):
    args = server_args(speculative_num_steps=STEPS)
    draft = MiniRunner(args, device=dev, is_draft_worker=True)
    assert draft.canary_manager.state.target_rows is None
    assert "found no target canary" in canary_log.text


@pytest.mark.parametrize("topk", [2, 4])
def test_eagle_draft_trees_are_refused_at_install(dev, topk):
    with pytest.raises(ValueError, match="speculative_eagle_topk"):
        MiniRunner(server_args(speculative_num_steps=STEPS, speculative_eagle_topk=topk), device=dev)


def test_a_draft_that_ends_its_init_by_itself_is_not_warned_about_during_warm_up(dev, canary_log):
    e = Eagle(dev, draft_init=False)
    for _ in range(40):  # more warm-up forwards than the enable warning waits for
        req = e.sched.new_request([1, 2, 3])
        e._draft_extend(e.sched.extend([req]))
        e.sched.finish(req)
    assert "mark_init_finished() was not called" not in canary_log.text
