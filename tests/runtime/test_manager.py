"""The manager: phase order per forward, dispatch to sub-forward managers, init gating, bracketing."""

from types import SimpleNamespace

import pytest
import torch

from canary_instrument.runtime import CanaryWiringError, install_canary, mark_init_finished
from canary_instrument.runtime.reports.stats import StatsLine

from .mini_engine import (
    LogitsModel,
    MHATokenToKVPool,
    MiniRunner,
    NestedModel,
    RecordingOps,
    Scheduler,
    TinyModel,
    draft_step_batches,
    server_args,
)


def _runner(dev, **kw):
    args = kw.pop("args", None) or server_args()
    runner = MiniRunner(args, device=dev, **kw)
    return runner, Scheduler(runner), RecordingOps(runner.canary_manager, runner.model)


def test_plan_then_verify_write_then_fingerprint_per_forward(dev):
    runner, sched, ops = _runner(dev)
    manager = runner.canary_manager
    mark_init_finished(manager)
    a, b = sched.new_request([5, 6, 7]), sched.new_request([9, 10, 11, 12, 13])
    batch = sched.extend([a, b])
    runner.forward(batch)

    pre, post = ops.calls
    # The plan came from the real batch before the pre-forward pass ran...
    assert pre == dict(kernel="pre", index=0, enabled=1, num_reqs=2, req_pool_indices=[a.row, b.row],
                       prefix=[0, 0], extend=[3, 5], model_calls=0)
    # ...as the batch's own device tensors: nothing was copied or sent for it.
    plan = ops.plans[0]
    assert plan.req_pool_indices is batch.req_pool_indices
    assert plan.prefix_lens is batch.extend_prefix_lens and plan.extend_lens is batch.extend_seq_lens
    # Post-ops ran after the real forward, with the same plan.
    assert post == dict(pre, kernel="post", model_calls=1) and ops.plans[1] is plan
    rows = manager.state.groups[0].rows
    written = rows[torch.tensor(a.slots + b.slots)]
    assert written[:, 1].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]  # positions
    assert written[:, 0].tolist() == [5, 6, 7, 9, 10, 11, 12, 13]  # tokens
    assert bool((written[:, 3] != 0).all())  # post-forward stored the real-KV fingerprints
    assert manager.single_forward_managers[0].plan is None  # nothing kept past the forward
    assert manager.step == 1


def test_decode_plan_writes_position_seq_len_minus_one(dev):
    runner, sched, ops = _runner(dev)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    runner.forward(sched.extend(reqs))
    runner.forward(sched.decode(reqs, [7, 8]))
    pre = ops.calls[2]
    assert pre["prefix"] == [3, 2] and pre["extend"] == [1, 1]
    assert runner.canary_manager.flush() == []


def test_multi_step_draft_dispatches_each_step_to_its_sub_forward_manager(dev):
    args = server_args(speculative_num_steps=3)
    runner, sched, ops = _runner(dev, args=args, is_draft_worker=True)
    manager = runner.canary_manager
    mark_init_finished(manager)
    target_tokens = [3, 1, 4, 1, 5]
    req = sched.new_request(target_tokens[1:])  # draft slot p holds target token p + 1
    extend = sched.extend([req])
    with manager.with_ops_outside_graph([0], extend), manager.with_active_single_forward_manager(0):
        runner.model.forward(extend.input_ids, extend.positions, extend)

    outer, steps = draft_step_batches(sched, [req], 2, guesses=[[60, 61]])
    with manager.with_ops_outside_graph(range(2), outer):
        for i, step in enumerate(steps):
            with manager.with_active_single_forward_manager(i):
                runner.model.forward(step.input_ids, step.positions, step)

    kernels = [(c["kernel"], c["index"], c["prefix"]) for c in ops.calls[2:]]
    assert kernels == [("pre", 0, [4]), ("post", 0, [4]), ("pre", 1, [5]), ("post", 1, [5])]
    assert manager.flush() == []
    rows = manager.state.groups[0].rows
    assert rows[req.slots[4], :2].tolist() == [60, 4] and rows[req.slots[5], :2].tolist() == [61, 5]


def test_nested_active_sub_forward_is_an_error(dev):
    manager = _runner(dev, args=server_args(speculative_num_steps=3))[0].canary_manager
    with manager.with_active_single_forward_manager(0):
        with pytest.raises(CanaryWiringError, match="nested"):
            with manager.with_active_single_forward_manager(1):
                pass
    # The failed nesting left the outer context usable.
    with manager.with_active_single_forward_manager(1):
        pass


def test_nested_outside_context_is_an_error(dev):
    runner, sched, _ = _runner(dev)
    manager = runner.canary_manager
    mark_init_finished(manager)
    batch = sched.extend([sched.new_request([1, 2])])
    with manager.with_ops_outside_graph([0], batch):
        with pytest.raises(CanaryWiringError, match="nested"):
            with manager.with_ops_outside_graph([0], batch):
                pass
        with manager.with_active_single_forward_manager(0):
            runner.model.forward(batch.input_ids, batch.positions, batch)


def test_sub_forward_index_out_of_range(dev):
    manager = _runner(dev)[0].canary_manager
    with pytest.raises(CanaryWiringError, match="out of range"):
        with manager.with_active_single_forward_manager(1):
            pass


def test_after_init_a_forward_without_active_sub_forward_is_an_error(dev):
    runner, sched, _ = _runner(dev)
    mark_init_finished(runner.canary_manager)
    batch = sched.extend([sched.new_request([1, 2])])
    with pytest.raises(CanaryWiringError, match="not wired"):
        runner.model.forward(batch.input_ids, batch.positions, batch)


def test_after_init_inside_ops_without_a_plan_is_an_error(dev):
    runner, sched, _ = _runner(dev)
    mark_init_finished(runner.canary_manager)
    batch = sched.extend([sched.new_request([1, 2])])
    with pytest.raises(CanaryWiringError, match="pre-ops inside the graph for sub-forward 0 while it is 'idle'"):
        with runner.canary_manager.with_active_single_forward_manager(0):
            runner.model.forward(batch.input_ids, batch.positions, batch)


def test_forwards_before_init_are_not_steps(dev, canary_log):
    runner, sched, _ = _runner(dev, args=server_args(kv_canary_stats_interval=2))
    manager = runner.canary_manager
    warm = sched.new_request([1, 2, 3])
    runner.forward(sched.extend([warm]))  # warm-up
    runner.forward(sched.decode([warm], [4]))  # capture
    sched.finish(warm)
    manager.flush()
    assert manager.step == 0
    mark_init_finished(manager)
    req = sched.new_request([5, 6])
    runner.forward(sched.extend([req]))  # step 1
    runner.forward(sched.decode([req], [7]))  # step 2
    assert manager.flush() == []
    assert manager.step == manager.stats().steps == 2
    [line] = StatsLine.find_all(canary_log.text)
    assert (line.step, line.pre_runs, line.post_runs) == (2, 2, 2)


def test_before_init_kernels_launch_disabled_and_do_nothing(dev):
    runner, sched, ops = _runner(dev)
    manager = runner.canary_manager
    batch = sched.extend([sched.new_request([1, 2, 3])])
    # Warm-up / capture: only the active context, no plan, no error.
    with manager.with_active_single_forward_manager(0):
        runner.model.forward(batch.input_ids, batch.positions, batch)
    runner.forward(batch)  # a wired warm-up forward
    assert [(c["kernel"], c["enabled"]) for c in ops.calls] == [("pre", 0), ("post", 0)] * 2
    assert int(manager.state.groups[0].rows.abs().sum()) == 0
    assert manager.flush() == [] and manager.stats().pre_runs == 0


def test_exception_in_the_forward_resets_the_phase(dev):
    runner, sched, ops = _runner(dev)
    manager = runner.canary_manager
    mark_init_finished(manager)
    req = sched.new_request([1, 2, 3])
    batch = sched.extend([req])
    with pytest.raises(ZeroDivisionError):
        with manager.with_ops_outside_graph([0], batch), manager.with_active_single_forward_manager(0):
            1 / 0
    assert manager.single_forward_managers[0].phase == "idle"
    runner.forward(batch)
    assert manager.flush() == []


def test_only_the_outermost_forward_is_bracketed(dev):
    runner, sched, ops = _runner(dev, model_cls=NestedModel)
    mark_init_finished(runner.canary_manager)
    runner.forward(sched.extend([sched.new_request([1, 2, 3])]))
    assert runner.model.forward_calls == 1  # the inner language-model forward ran once...
    assert [c["kernel"] for c in ops.calls] == ["pre", "post"]  # ...and was bracketed once
    assert runner.canary_manager.flush() == []


def test_a_decode_s_post_pass_starts_beside_the_model_s_logits(dev):
    runner, sched, ops = _runner(dev, model_cls=LogitsModel)
    manager = runner.canary_manager
    mark_init_finished(manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    runner.forward(sched.extend(reqs))
    for i in range(3):
        runner.forward(sched.decode(reqs, [40 + i, 50 + i]))
    # Every pass ran, each once a forward, and the post passes fingerprinted the KV the forwards wrote: clean.
    assert [c["kernel"] for c in ops.calls] == ["pre", "post"] * 4
    assert manager.flush() == []
    assert manager.stats().tokens_protected == 5 + 3 * 2
    if dev == "cuda":
        # An extend's passes on its forward's stream; a decode's both on the second stream, the post pass forked at
        # the logits (the forward's stream waited for them when the model returned).
        pre, post = ops.streams[0::2], ops.streams[1::2]
        forward = runner.model.streams
        assert pre[0] == post[0] == forward[0]
        assert all(q == p != f for p, q, f in zip(pre[1:], post[1:], forward[1:]))


def test_unbracketing_the_model_removes_its_logits_hook(dev):
    from canary_instrument.runtime.step.bracket import logits_modules, unbracket_model_forward

    runner = _runner(dev, model_cls=LogitsModel)[0]
    assert logits_modules(runner.model) == [runner.model.logits_processor]
    assert len(runner.model.logits_processor._forward_pre_hooks) == 1
    unbracket_model_forward(runner.model)
    assert not runner.model.logits_processor._forward_pre_hooks


def test_installing_twice_on_one_model_is_refused(dev):
    runner = _runner(dev)[0]
    with pytest.raises(ValueError, match="already bracketed"):
        install_canary(server_args=runner.server_args, model_runner=runner)


def test_draft_worker_guard_in_the_generated_member(dev):
    runner, sched, ops = _runner(dev, is_draft_worker=True)
    mark_init_finished(runner.canary_manager)
    batch = sched.extend([sched.new_request([1, 2, 3])])
    # The ModelRunner.forward site is off on a draft worker; the EAGLE worker's sites drive it.
    with pytest.raises(CanaryWiringError, match="not wired"):
        runner.forward(batch)
    assert ops.calls == []


def test_a_reused_site_does_not_accept_an_index_that_only_equals_a_valid_one(dev):
    """Sites are cached per (listing, active); 1.0 equals 1 as a key but is no sub-forward index."""
    manager = _runner(dev, args=server_args(speculative_num_steps=3))[0].canary_manager
    with manager.with_active_single_forward_manager(1):
        pass
    with pytest.raises(CanaryWiringError, match="out of range"):
        with manager.with_active_single_forward_manager(1.0):
            pass
    with pytest.raises(CanaryWiringError, match="out of range"):
        with manager.with_ops_outside_graph([1.0], None):
            pass


def test_a_draft_runner_that_reads_a_pool_it_does_not_own_gets_no_canary(dev, caplog):
    """Frozen-KV MTP's draft reads its target's KV through a view and owns a placeholder pool of a few
    slots, while its allocator (the target's) hands out the target's slots: a canary of its own could not
    hold a row for what it reads. It gets none; the target's canary checks that pool."""
    target = MiniRunner(server_args(), device=dev)
    placeholder_pool = MHATokenToKVPool(8, dev)
    draft = SimpleNamespace(
        server_args=target.server_args, device=dev, is_draft_worker=True,
        req_to_token_pool=target.req_to_token_pool, token_to_kv_pool=placeholder_pool,
        token_to_kv_pool_allocator=SimpleNamespace(size=256), model=TinyModel(placeholder_pool).to(dev),
    )
    with caplog.at_level("WARNING", logger="canary_instrument.runtime"):
        assert install_canary(server_args=target.server_args, model_runner=draft) is None
    assert "reads a pool it does not own" in caplog.text
    assert "__kv_canary_bracketed__" not in vars(draft.model)  # nothing installed on it
