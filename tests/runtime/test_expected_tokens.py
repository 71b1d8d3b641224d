"""Expected tokens from device data only: the target's sampled-token table and the EAGLE draft's
check against the target's rows. No host token lists reach the runtime."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import profile

from canary_instrument.runtime import CanaryViolationError, mark_init_finished
from canary_instrument.runtime.reports.stats import StatsLine
from canary_instrument.runtime.reports.summary import SummaryLine
from canary_instrument.runtime.step.plan import plan_from_batch

from .mini_engine import ForwardMode, MiniRunner, ReplayedGraph, Scheduler, draft_step_batches, server_args


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


def _verify_round(e, reqs, last, drafts, accepted, bonus, width, draft_extend, swap_first=False):
    """One EAGLE decode step after the draft chain: verify [last, drafts] on ``e.target``, keep ``accepted`` drafts
    plus ``bonus``; ``draft_extend(extend, predicts)`` runs the draft-extend of the verified positions (``extend``:
    the batch, ``width`` tokens a request; ``predicts``: per request, the target's predictions, the accepted drafts,
    the bonus, then whatever follows a rejection); returns the new last tokens."""
    sched = e.sched
    ids = [[t] + d for t, d in zip(last, drafts)]
    if swap_first:
        ids[0][0], ids[1][0] = ids[1][0], ids[0][0]
    verify, cached = _target_verify(sched, reqs, ids)
    e.target.forward(verify)
    predicts = [d[:a] + [b] + [200 + j for j in range(len(d) - a)] for d, a, b in zip(drafts, accepted, bonus)]
    extend = dataclasses.replace(
        verify, forward_mode=ForwardMode.DRAFT_EXTEND, seq_lens=verify.seq_lens + width,
        extend_prefix_lens=None, extend_seq_lens=torch.full((len(reqs),), width, device=e.dev),
        num_tokens_per_req=width, spec_info=None,
    )
    draft_extend(extend, predicts)
    for r, n, a in zip(reqs, cached, accepted):
        del r.tokens[n + 1 + a :]  # verify appended [last, drafts]; keep last + the accepted ones
        sched.free_slots += r.slots[n + 1 + a :]
        r.slots = r.slots[: n + 1 + a]
    return list(bonus)  # not in the cache yet: the next verify's first inputs


def _eagle_round(e, reqs, last, drafts, accepted, bonus, swap_first=False):
    """One single-layer EAGLE decode step (``_verify_round``): the draft-extend reads the target's predictions."""

    def draft_extend(extend, predicts):
        e._draft_extend(dataclasses.replace(extend, input_ids=torch.tensor([t for p in predicts for t in p],
                                                                           device=e.dev)))

    return _verify_round(e, reqs, last, drafts, accepted, bonus, STEPS, draft_extend, swap_first)


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
    """A draft whose worker has sites but no init-finished hook ends its init at its first site after the target's
    first step, and its sites check from then on."""
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


# ---------------------------------------------------------------------- multi-layer EAGLE (MTP) draft runners

WIDTH = STEPS + 1  # multi-layer EAGLE: speculative_num_draft_tokens == speculative_num_steps + 1


def _rotated(ids, new, at=None):
    """sglang's ``rotate_input_ids`` on one request's segment: shift left by one, write ``new`` at ``at`` (the
    request's last accepted row, ``select_index``), else at the end."""
    out = list(ids[1:]) + [ids[-1]]
    out[len(ids) - 1 if at is None else at] = new
    return out


class MultiLayerEagle:
    """sglang's multi-layer EAGLE worker (0.5.17 ``multi_layer_eagle_worker_v2``), as the canary sees it: one draft
    runner per chain step, each with its own KV pool, all sharing the target's req_to_token and slots, installed in
    chain order. The worker wires no canary site and ends no draft runner's init: a draft forward is the runner's
    own ``forward`` (whose site is off on a draft worker) or a replay of the step's draft-extend graph, captured
    through the capture site ``apply`` wires in its graph runner. Chain step s reads the input ids rotated s + 1
    times. ``padding``: how the graphs pad a batch (``ReplayedGraph``)."""

    def __init__(self, dev, graphs=True, padding="zero", sizes=(1, 2), **args):
        args = server_args(speculative_num_steps=STEPS, **args)
        self.dev = dev
        self.target = MiniRunner(args, device=dev, size=512, max_context=64)
        self.drafts = [MiniRunner(args, device=dev, size=512, max_context=64, is_draft_worker=True,
                                  req_to_token_pool=self.target.req_to_token_pool) for _ in range(STEPS)]
        self.sched = Scheduler(self.target)
        mark_init_finished(self.target.canary_manager)  # the target's hook; the drafts get none
        self.graphs = [ReplayedGraph(d, WIDTH, sizes, padding) for d in self.drafts] if graphs else None

    @property
    def managers(self):
        return [d.canary_manager for d in self.drafts]

    def extend(self, reqs, sampled, tails=None, guesses=None):
        """A target extend (prefill or a chunk of it) and its sample, then the chain's draft-extend over the same
        positions. Step 0's ids are the request's next tokens with ``tails`` (default: the sampled token, as the
        0.5.17 multi-layer worker does even for a chunk the engine goes on with) at the end; each later step's are
        the last one's rotated once more, with the chain's guess at the end."""
        prefix = [len(r.slots) for r in reqs]
        batch = self.sched.extend(reqs)
        self.target.forward_and_sample(batch, sampled)
        tails = sampled if tails is None else tails
        segments = [r.tokens[p + 1:] + [t] for r, p, t in zip(reqs, prefix, tails)]
        for step, draft in enumerate(self.drafts):
            if step:
                segments = [_rotated(s, 300 + 10 * step + i) for i, s in enumerate(segments)]
            draft.forward(dataclasses.replace(batch, input_ids=torch.tensor(
                [t for s in segments for t in s], device=self.dev)))

    def prefill(self, prompts, sampled):
        reqs = [self.sched.new_request(p) for p in prompts]
        self.extend(reqs, sampled)
        return reqs

    def round(self, reqs, last, drafts, accepted, bonus, swap_first=False):
        """One decode step (``_verify_round``): each chain step's draft-extend runs over the verified positions (step 0
        reads the target's predictions; each later step's ids are rotated once more, the chain's guess at the
        request's last accepted row)."""

        def draft_extend(extend, segments):
            for step, draft in enumerate(self.drafts):
                if step:
                    segments = [_rotated(s, 400 + 10 * step + i, at=a)
                                for i, (s, a) in enumerate(zip(segments, accepted))]
                ids = torch.tensor([t for s in segments for t in s], device=self.dev)
                batch = dataclasses.replace(extend, input_ids=ids)
                if self.graphs is not None:
                    self.graphs[step].replay(batch)
                else:
                    draft.forward(batch)

        return _verify_round(self, reqs, last, drafts, accepted, bonus, WIDTH, draft_extend, swap_first)

    def serve(self, rounds=4, swap_at=None):
        reqs = self.prefill([[1, 2, 3, 4], [5, 6, 7, 8, 9]], [10, 11])
        last = [10, 11]
        steps = []
        for round_ in range(rounds):
            drafts = [[30 + 3 * round_ + j for j in range(STEPS)], [60 + 3 * round_ + j for j in range(STEPS)]]
            accepted = [(2, 0), (0, 1), (1, 3), (3, 2)][round_ % 4]
            last = self.round(reqs, last, drafts, accepted, [40 + round_, 70 + round_], swap_first=round_ == swap_at)
            steps.append(self.target.canary_manager.step)
        return reqs, steps


@pytest.mark.parametrize("graphs", [True, False], ids=["graph-replay", "eager"])
def test_multi_layer_eagle_draft_runners_follow_their_target_and_stay_clean(dev, graphs):
    """sglang's multi-layer EAGLE worker has no canary site and never ends its draft runners' init: the target ends
    it at its first step end, and every draft runner is checked from then on, through its graph replays (which the
    host never sees: its target's step ends read what they published) or its bare forwards (planned by themselves)."""
    e = MultiLayerEagle(dev, graphs=graphs)
    target = e.target.canary_manager
    assert [m.steps.target for m in e.managers] == [target.steps] * STEPS and target.drafts == e.managers
    assert all(m.is_chain_step for m in e.managers) and not target.is_chain_step
    e.serve(rounds=6)
    assert all(m.init_finished and m.follows_target for m in e.managers)
    assert target.flush() == [] and [m.flush() for m in e.managers] == [[]] * STEPS
    for m in e.managers:
        # One forward a target step from the target's first step on (the prefill's draft-extend, then every round's),
        # each verifying what the last one wrote: their passes ran and were read.
        stats = m.stats()
        assert stats.pre_runs == stats.post_runs == 1 + 6, m
        assert stats.verified > 0 and stats.written == (9 + 6 * 2 * WIDTH) * 2  # both requests' rows, K and V
        assert m.step == target.step - 1  # a step each target step end after the first


def test_a_chain_step_s_plans_check_only_what_is_sound_for_the_chain(dev):
    """What a multi-layer chain step's plan leaves out (docs/runtime.md section 4): the links of the prefix it reads,
    and the comparison with the target except at the last position before a draft-extend after a verify; a
    prefill's or chunk's draft-extend compares nothing. A single-layer EAGLE draft keeps the full comparison."""
    e = MultiLayerEagle(dev, graphs=False)
    req = e.sched.new_request([1, 2, 3, 4])
    prefill = e.sched.extend([req])
    after_verify = dataclasses.replace(prefill, forward_mode=ForwardMode.DRAFT_EXTEND)
    first, second = e.managers[0].single_forward_managers[0], e.managers[1].single_forward_managers[0]
    enabled = e.managers[0].enabled
    plans = {(name, step): plan_from_batch(batch, enabled, draft=True, chain=sfm.chain)
             for name, batch in (("prefill", prefill), ("draft-extend", after_verify))
             for step, sfm in (("first", first), ("second", second))}
    assert {k: (p.prefix_links, p.target_margin, p.target_window) for k, p in plans.items()} == {
        ("prefill", "first"): (False, -1, 0), ("draft-extend", "first"): (False, 0, 1),
        ("prefill", "second"): (False, -1, 0), ("draft-extend", "second"): (False, 0, 1)}
    assert {p.min_prefix for p in plans.values()} == {0}
    single = Eagle(dev).draft.canary_manager.single_forward_managers[0]
    assert not single.chain
    plan = plan_from_batch(after_verify, enabled, draft=True, chain=single.chain)
    assert (plan.prefix_links, plan.target_margin, plan.target_window) == (True, 0, 0)


def _padded_serving(dev, padding):
    """Two requests served through draft-extend graphs captured at batch size 2 only; then one round of request 0
    alone (padded to 2: the padded row keeps request 1's req-pool index, live), then both again."""
    e = MultiLayerEagle(dev, padding=padding, sizes=(2,))
    reqs, _ = e.serve(rounds=2)
    rows_before = [m.state.groups[0].rows[reqs[1].slots[:4]].clone() for m in e.managers]
    e.round(reqs[:1], [41], [[50, 51, 52]], (1,), [42])
    last = e.round(reqs, [42, 71], [[53, 54, 55], [80, 81, 82]], (2, 1), [43, 72])
    e.round(reqs, last, [[56, 57, 58], [83, 84, 85]], (0, 3), [44, 73])
    return e, reqs, rows_before


@pytest.mark.parametrize("padding", ["stale-marked", "stale"])
def test_padded_draft_extend_rows_with_a_stale_live_index_neither_write_nor_report(dev, padding):
    """sglang 0.5.17's multi-layer draft-extend graph pads a batch with rows that keep a live request's req-pool index
    (its buffer fill stores the index for real rows only), seq_lens at the backend's fill value (1) and an accept count
    of -1 (0.5.13-0.5.15: the stale count). Told apart by the mark and by their negative prefix, they neither write over
    the live request's rows nor report."""
    e, reqs, rows_before = _padded_serving(dev, padding)
    assert e.target.canary_manager.flush() == [] and [m.flush() for m in e.managers] == [[]] * STEPS
    for m, before in zip(e.managers, rows_before):
        assert torch.equal(m.state.groups[0].rows[reqs[1].slots[:4]], before)  # request 1's rows of 0..3 intact


@pytest.mark.parametrize("padding", ["stale-marked", "stale"])
def test_planned_as_requests_the_stale_padded_rows_report_what_the_h200_run_did(dev, padding, monkeypatch):
    """The same serving with padding told by req-pool row 0 only (the follower design of 121a967): the padded row is
    planned as request 1 with prefix 1 - 4 = -3, whose passes report padding_slot at position -3 (the H200 MTP run's
    false reports) and write request 1's row of position 0."""
    from canary_instrument.runtime.step import plan as plan_module

    monkeypatch.setattr(plan_module, "_draft_padding", lambda plan, batch: None)
    e, reqs, rows_before = _padded_serving(dev, padding)
    found = [v for m in e.managers for v in m.flush()]
    assert any("padding_slot" in v.reasons and v.position == -3 and v.req_pool_index == reqs[1].row for v in found)
    assert not torch.equal(e.managers[0].state.groups[0].rows[reqs[1].slots[:4]], rows_before[0])


def test_a_swapped_verify_input_is_caught_by_the_first_chain_step_s_graph(dev):
    """next_token_swap in a target verify: only the draft's comparison sees it (the verify's own rows are
    consistent). Chain step 0's draft-extend graph after that verify compares its row of the last position before its
    new ones with the target's next row, reports the swap at the target's row, labelled with the verify's step, read
    at the next target step end; later draft-extends compare later positions and say nothing more."""
    e = MultiLayerEagle(dev)
    target, first = e.target.canary_manager, e.managers[0]
    reqs, steps = e.serve(rounds=3, swap_at=1)
    found = first.flush()
    assert target.flush() == [] and [m.flush() for m in e.managers[1:]] == [[]] * (STEPS - 1)
    assert {v.reasons for v in found} == {frozenset({"token"})} and {v.kernel for v in found} == {"pre_forward"}
    # Round 1 verified [last, drafts] at the cached length n: request 0 kept 2 drafts in round 0 (n = 4 + 1 + 2),
    # request 1 none (n = 5 + 1); each one's row n got the other's last token (the target's as stored).
    assert {(v.req_pool_index, v.position, v.stored, v.expected, v.slot) for v in found} == {
        (reqs[0].row, 7, 70, 40, reqs[0].slots[7]), (reqs[1].row, 6, 40, 70, reqs[1].slots[6])}
    assert len(found) == 2 * 2  # each once, in its K and V rows
    assert {v.step for v in found} == {steps[1]}


def test_a_follower_s_violation_read_at_flush_carries_the_target_s_step(dev):
    e = MultiLayerEagle(dev)
    reqs, steps = e.serve(rounds=2, swap_at=1)  # no target step after the swap's draft-extend
    found = e.managers[0].flush()
    assert found and {v.step for v in found} == {steps[1]}


def test_a_follower_s_violation_raises_out_of_the_target_s_next_step(dev):
    e = MultiLayerEagle(dev, kv_canary="raise")
    with pytest.raises(CanaryViolationError):
        e.serve(rounds=3, swap_at=1)


def test_each_draft_runner_logs_its_own_stats_lines(dev, canary_log):
    e = MultiLayerEagle(dev, kv_canary_stats_interval=2)
    e.serve(rounds=6)
    for m in [e.target.canary_manager, *e.managers]:
        m.flush()
    lines = StatsLine.find_all(canary_log.text)
    # The target: steps 2, 4, 6 of its 7 (a prefill, six rounds); each draft runner: a step at each target step end
    # after the first (6), its forwards read: one a target step.
    assert sorted(s.step for s in lines) == [2] * 4 + [4] * 4 + [6] * 4
    assert all(s.pre_runs == s.step and s.violations == 0 for s in lines)


@pytest.mark.parametrize("next_prompt_tail", [False, True], ids=["sampled-tail", "next-prompt-tail"])
def test_a_chunk_s_draft_tail_from_the_discarded_sample_is_not_reported(dev, next_prompt_tail):
    """A prompt prefilled in two chunks: the 0.5.17 multi-layer worker ends the first chunk's draft-extend with the
    chunk's (discarded) sample, not the prompt's next token (its code's TODO "same chunked-prefill chain divergence as
    PR #26329"). The draft's KV there really differs from the prompt, but that is the worker's own behaviour: no chain
    step compares a prefill's or chunk's rows with the target, nor re-checks the links of the prefix it reads."""
    e = MultiLayerEagle(dev)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    req = e.sched.new_request(prompt[:4])
    e.extend([req], [99], tails=[prompt[4]] if next_prompt_tail else None)  # chunk 1; the engine discards 99
    req.tokens = list(prompt)
    e.extend([req], [20])  # chunk 2
    last = e.round([req], [20], [[21, 22, 23]], [1], [24])
    e.round([req], last, [[25, 26, 27]], [3], [28])
    assert e.target.canary_manager.flush() == [] and [m.flush() for m in e.managers] == [[]] * STEPS
    assert all(m.stats().verified > 0 for m in e.managers)


def test_a_prefix_re_pointed_at_another_request_s_draft_rows_is_not_reported(dev):
    """Two requests prefill one prompt in chunks that end at different positions (each chunk's draft tail holds its
    own discarded sample); the prefix cache then re-points request B's first positions at request A's slots (sglang's
    cache_unfinished_req once A's prefix is in the tree): the target's rows for one prompt are the same, the drafts'
    differ at A's chunk tail, so B's own row after the re-pointed range no longer chains from the row before it.
    A chain step does not check the links of the prefix it reads: the rounds that follow stay clean."""
    e = MultiLayerEagle(dev)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    a, b = e.sched.new_request(prompt[:4]), e.sched.new_request(prompt[:6])
    e.extend([a, b], [97, 98])  # A's chunk ends at 4, B's at 6: draft tails 97 at A's 3, 98 at B's 5
    b.slots[:4] = a.slots[:4]  # re-pointed (the scheduler writes it into req_to_token with the next batch)
    a.tokens, b.tokens = list(prompt), list(prompt)
    e.extend([a, b], [30, 30])
    last = e.round([a, b], [30, 30], [[31, 32, 33], [31, 32, 33]], (1, 2), [40, 70])
    e.round([a, b], last, [[41, 42, 43], [71, 72, 73]], (3, 0), [50, 80])
    assert e.target.canary_manager.flush() == [] and [m.flush() for m in e.managers] == [[]] * STEPS


def test_the_same_re_pointing_breaks_the_draft_s_chain_where_links_would_be_checked(dev, monkeypatch):
    """Control for the test above: with the prefix links checked (a single-layer draft's plan), request B's draft
    rows report a link break at position 4, its first own row after A's chunk tail."""
    from canary_instrument.runtime.step import plan as plan_module

    original = plan_module._chain_step

    def with_links(plan, kind, after_verify):
        original(plan, kind, after_verify)
        plan.prefix_links = True

    monkeypatch.setattr(plan_module, "_chain_step", with_links)
    e = MultiLayerEagle(dev)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    a, b = e.sched.new_request(prompt[:4]), e.sched.new_request(prompt[:6])
    e.extend([a, b], [97, 98])
    b.slots[:4] = a.slots[:4]
    a.tokens, b.tokens = list(prompt), list(prompt)
    e.extend([a, b], [30, 30])
    found = e.managers[0].flush()
    assert found and {v.reasons for v in found} == {frozenset({"link"})}
    assert {(v.req_pool_index, v.position) for v in found} == {(b.row, 4)}


@pytest.mark.parametrize("chain_step", [0, 2])
def test_a_corrupted_draft_kv_row_is_reported_by_its_chain_step(dev, chain_step):
    """What a chain step still checks in the prefix it reads: the real KV under each row (fingerprints) and the row's
    position. A draft KV row overwritten under a live request is reported by that draft runner's next forward."""
    e = MultiLayerEagle(dev, kv_canary_real_kv="all")
    reqs, _ = e.serve(rounds=2)
    draft = e.drafts[chain_step]
    slot = reqs[0].slots[2]
    draft.token_to_kv_pool.k_buffer[1][slot] += 1.0  # layer 1's K row of request 0's position 2
    other = reqs[1].slots[3]
    rows = draft.canary_manager.state.groups[0].rows
    rows[other, :3] = rows[reqs[1].slots[1], :3]  # request 1's row of position 3 now holds its position 1's (K half)
    e.round(reqs, [41, 71], [[50, 51, 52], [80, 81, 82]], (1, 1), [42, 72])
    found = draft.canary_manager.flush()
    assert e.target.canary_manager.flush() == []
    assert [m.flush() for i, m in enumerate(e.managers) if i != chain_step] == [[]] * (STEPS - 1)
    assert {(v.req_pool_index, v.position, v.slot, v.half) for v in found if "fingerprint" in v.reasons} == {
        (reqs[0].row, 2, slot, "k")}
    assert {(v.req_pool_index, v.position, v.slot, v.stored, v.expected) for v in found if "position" in v.reasons} == {
        (reqs[1].row, 3, other, 1, 3)}
    assert {v.kernel for v in found} == {"pre_forward"}


def test_only_the_first_chain_step_is_compared_with_the_target(dev, canary_log):
    """Chain step s's slot p holds token p + s + 1; the comparison reads the target's row of position p + 1, so only
    the first draft runner installed on a target makes it (the others are said to be chain steps)."""
    e = MultiLayerEagle(dev)
    rows = [m.state.target_rows for m in e.managers]
    assert rows[0] is e.target.canary_manager.state.groups[0].rows and rows[1:] == [None] * (STEPS - 1)
    assert "is draft runner 2 on its target (a multi-layer EAGLE chain step: slot p holds token p + 2)" in (
        canary_log.text)
    assert "is draft runner 3 on its target" in canary_log.text
