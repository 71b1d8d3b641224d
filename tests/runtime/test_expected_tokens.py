"""Expected-token checking: a per-request table filled from the batch's known token ids."""

from types import SimpleNamespace

import torch

from canary_instrument.runtime import mark_init_finished

from .mini_engine import ForwardMode, MiniRunner, Scheduler, server_args


def _serving(dev, **args):
    runner = MiniRunner(server_args(**args), device=dev, max_context=64)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    return runner, sched


def test_swapped_next_tokens_are_caught_on_the_step(dev):
    runner, sched = _serving(dev)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7])]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [50, 60])
    batch.input_ids = batch.input_ids.flip(0)  # the model is fed each other's next token
    runner.forward(batch)
    found = runner.canary_manager.flush()
    assert found and {v.reasons for v in found} == {frozenset({"token"})}
    assert {v.kernel for v in found} == {"post_forward"}  # caught when verifying this step's writes
    assert {(v.req_pool_index, v.position, v.stored, v.expected) for v in found} == {
        (reqs[0].row, 3, 60, 50),
        (reqs[1].row, 4, 50, 60),
    }


def test_without_the_token_check_a_swap_goes_unseen(dev):
    runner, sched = _serving(dev, kv_canary_token_check=False)
    assert runner.canary_manager.state.expected_tokens is None
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7])]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [50, 60])
    batch.input_ids = batch.input_ids.flip(0)
    runner.forward(batch)
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
    sched._map(reqs)
    batch = sched._batch(reqs, ForwardMode.TARGET_VERIFY, ids, pos, locs)
    batch.seq_lens = torch.tensor(cached, device=sched.device)
    batch.spec_info = SimpleNamespace(draft_token_num=len(drafts[0]))
    batch.canary_token_ids = [list(r.tokens) for r in reqs]
    return batch, cached


def _accept(sched, reqs, drafts, cached, accepted):
    for r, d, n, a in zip(reqs, drafts, cached, accepted):
        r.tokens += d[:a]
        sched.free_slots += r.slots[n + a :]
        r.slots = r.slots[: n + a]


def test_target_verify_rounds_with_partial_acceptance_stay_clean(dev):
    runner, sched = _serving(dev, speculative_num_steps=3)
    reqs = [sched.new_request([1, 2, 3, 4]), sched.new_request([5, 6])]
    runner.forward(sched.extend(reqs))
    accepted_plan = [(3, 0), (1, 2), (0, 3), (2, 2), (3, 1)]
    for round_, accepted in enumerate(accepted_plan):
        drafts = [[10 * round_ + j for j in range(3)], [10 * round_ + 5 + j for j in range(3)]]
        batch, cached = _target_verify(sched, reqs, drafts)
        runner.forward(batch)
        _accept(sched, reqs, drafts, cached, accepted)
    assert runner.canary_manager.flush() == []
    stats = runner.canary_manager.stats()
    assert stats.pre_runs == 1 + len(accepted_plan)


def test_accepted_token_that_differs_from_what_was_written_is_caught(dev):
    runner, sched = _serving(dev, speculative_num_steps=3)
    reqs = [sched.new_request([1, 2, 3, 4])]
    runner.forward(sched.extend(reqs))
    drafts = [[70, 71, 72]]
    batch, cached = _target_verify(sched, reqs, drafts)
    runner.forward(batch)
    # The engine records a different token than the one whose KV it kept (an off-by-one in acceptance).
    _accept(sched, reqs, [[70, 99, 72]], cached, [2])
    batch, cached = _target_verify(sched, reqs, [[80, 81, 82]])
    runner.forward(batch)
    found = runner.canary_manager.flush()
    assert {(v.position, v.stored, v.expected) for v in found} == {(5, 71, 99)}
    assert {v.reasons for v in found} == {frozenset({"token"})}


def test_a_reused_row_never_inherits_the_previous_requests_tokens(dev):
    runner, sched = _serving(dev, speculative_num_steps=3)
    old = sched.new_request(list(range(100, 130)))
    runner.forward(sched.extend([old]))
    for i in range(5):
        runner.forward(sched.decode([old], [200 + i]))
    sched.finish(old)
    free_rows = runner.req_to_token_pool.free
    free_rows.insert(0, free_rows.pop(free_rows.index(old.row)))
    new = sched.new_request([7, 8])
    assert new.row == old.row
    runner.forward(sched.extend([new]))
    # Draft tokens land on positions the old request's tokens occupied in this table row.
    for round_ in range(12):
        drafts = [[400 + 3 * round_ + j for j in range(3)]]
        batch, cached = _target_verify(sched, [new], drafts)
        runner.forward(batch)
        _accept(sched, [new], drafts, cached, [round_ % 4])
    assert len(new.tokens) > 12
    assert runner.canary_manager.flush() == []
    known = batch.canary_token_ids[0]  # what the last forward knew
    table = runner.canary_manager.state.expected_tokens
    assert table[new.row, : len(known)].tolist() == known
