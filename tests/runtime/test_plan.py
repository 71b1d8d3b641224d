"""Plans come from the forward batch's own device tensors, with sglang's conventions per forward mode,
and CUDA-graph padding rows (req-pool index 0) are skipped."""

from types import SimpleNamespace

import pytest
import torch

from canary_instrument.runtime import CanaryWiringError, attach_radix_cache, mark_init_finished
from canary_instrument.runtime.step.plan import plan_from_batch

from .mini_engine import ForwardBatch, ForwardMode, MiniRunner, RecordingOps, Scheduler, plan_rows, server_args

ENABLED = torch.ones(1, dtype=torch.int32)


class DraftExtendV2:
    """sglang's DRAFT_EXTEND_V2: not an extend by `is_extend()`, only by `is_draft_extend_v2()`."""

    def is_idle(self):
        return False

    def is_target_verify(self):
        return False

    def is_extend(self):
        return False

    def is_draft_extend_v2(self):
        return True

    def is_decode(self):
        return False


def _batch(mode, bs=2, **fields):
    t = lambda *v: torch.tensor(v)  # noqa: E731
    base = dict(forward_mode=mode, batch_size=bs, req_pool_indices=t(3, 5), seq_lens=t(9, 4),
                positions=t(8, 3), input_ids=t(1, 2), extend_prefix_lens=None, extend_seq_lens=None)
    base.update(fields)
    return SimpleNamespace(**base)


def test_decode_writes_at_positions():
    batch = _batch(ForwardMode.DECODE)
    plan = plan_from_batch(batch, ENABLED)
    assert plan.prefix_lens is batch.positions and plan.req_pool_indices is batch.req_pool_indices
    assert plan_rows(plan) == dict(num_reqs=2, req_pool_indices=[3, 5], prefix=[8, 3], extend=[1, 1])
    assert plan.check_sampled and plan.target_margin == -1


def test_eagle_draft_steps_follow_positions_and_check_the_target_below_the_committed_prefix():
    # sglang's draft chain leaves seq_lens at the committed length c while positions advance (c + i).
    batch = _batch(ForwardMode.DECODE, seq_lens=torch.tensor([8, 3]), positions=torch.tensor([9, 4]))
    plan = plan_from_batch(batch, ENABLED, index=1, draft=True)
    assert plan_rows(plan)["prefix"] == [9, 4]
    assert plan.target_margin == 2 and not plan.check_sampled  # checks p < prefix - 2 = c - 1


def test_target_verify_writes_the_draft_tokens_after_seq_lens():
    batch = _batch(ForwardMode.TARGET_VERIFY, input_ids=torch.arange(8), spec_info=SimpleNamespace(draft_token_num=4))
    plan = plan_from_batch(batch, ENABLED)
    assert plan.prefix_lens is batch.seq_lens
    assert plan_rows(plan)["extend"] == [4, 4] and not plan.check_sampled


def test_extend_uses_the_prefix_and_extend_lengths():
    batch = _batch(ForwardMode.EXTEND, extend_prefix_lens=torch.tensor([0, 2]), extend_seq_lens=torch.tensor([9, 2]))
    plan = plan_from_batch(batch, ENABLED)
    assert plan.prefix_lens is batch.extend_prefix_lens and plan.extend_lens is batch.extend_seq_lens
    assert plan_rows(plan) == dict(num_reqs=2, req_pool_indices=[3, 5], prefix=[0, 2], extend=[9, 2])


def test_draft_extend_v2_without_prefix_lengths_derives_them_from_seq_lens():
    # sglang's draft-extend graph replay passes extend_seq_lens and the post-write seq_lens only.
    batch = _batch(DraftExtendV2(), seq_lens=torch.tensor([12, 7]), extend_seq_lens=torch.tensor([4, 4]))
    plan = plan_from_batch(batch, ENABLED, draft=True)
    assert plan.prefix_is_end and plan.prefix_lens is batch.seq_lens
    assert plan_rows(plan)["prefix"] == [8, 3] and plan.target_margin == 0


def test_an_idle_batch_plans_nothing():
    assert plan_from_batch(_batch(ForwardMode.IDLE, bs=0), ENABLED) is None
    assert plan_from_batch(_batch(ForwardMode.DECODE, bs=0), ENABLED) is None


def test_a_forward_without_its_batch_is_a_wiring_error():
    with pytest.raises(CanaryWiringError, match="no forward batch"):
        plan_from_batch(None, ENABLED)


def test_a_decode_with_several_tokens_per_request_is_refused():
    batch = _batch(ForwardMode.DECODE, positions=torch.tensor([8, 8, 3, 3]))
    with pytest.raises(CanaryWiringError, match="topk > 1"):
        plan_from_batch(batch, ENABLED)


def test_graph_padding_rows_are_skipped(dev):
    # A decode batch padded the way a graph runner pads it: rows with req-pool index 0, position 0,
    # token 0 and KV slot 0. The model writes slot 0's KV; the canary neither checks nor writes them.
    runner = MiniRunner(server_args(), device=dev)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    runner.forward_and_sample(sched.extend(reqs), [6, 7])
    real = sched.decode(reqs, [6, 7])
    zeros = torch.zeros(2, dtype=torch.int64, device=dev)
    padded = ForwardBatch(ForwardMode.DECODE, 4, torch.cat([real.req_pool_indices, zeros]),
                          torch.cat([real.seq_lens, zeros + 1]), torch.cat([real.input_ids, zeros]),
                          torch.cat([real.positions, zeros]), torch.cat([real.out_cache_loc, zeros]))
    runner.forward(padded)
    manager = runner.canary_manager
    assert manager.flush() == []
    assert manager.stats().tokens_protected == 5 + 2
    assert manager.state.groups[0].rows[0].abs().sum() == 0  # padding slot 0 never got a row


def test_non_consecutive_sub_forwards_each_read_their_own_batch(dev):
    runner = MiniRunner(server_args(speculative_num_steps=4), device=dev)
    manager = runner.canary_manager
    ops = RecordingOps(manager, runner.model)
    sched = Scheduler(runner)
    mark_init_finished(manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7, 8])]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [9, 10])
    with manager.with_ops_outside_graph([0, 2], batch):
        for i in (0, 2):
            with manager.with_active_single_forward_manager(i):
                runner.model.forward(batch.input_ids, batch.positions, batch)
    by_index = {c["index"]: c for c in ops.calls if c["kernel"] == "pre"}
    assert set(by_index) == {0, 2}
    assert by_index[0]["prefix"] == by_index[2]["prefix"] == [3, 5]
    assert by_index[2]["req_pool_indices"] == [r.row for r in reqs]


def test_per_forward_workspace_is_the_small_buffers_and_the_radix_cache_is_kept(dev):
    runner = MiniRunner(server_args(kv_canary_ring_size=16), device=dev, max_reqs=8)
    manager = runner.canary_manager
    # enable flag (4 B) + status vector (12 x 8 B, the sweep's 3 counters included) + its publish counter
    # (8 B) + ring (16 x 64 B) + sampled-token table and staging (9 rows x 4 B each) + the staged
    # batch's rows and their count (10 x 8 B)
    assert manager.per_forward_workspace_bytes() == 4 + 12 * 8 + 8 + 16 * 64 + 2 * 9 * 4 + 10 * 8
    cache = object()
    attach_radix_cache(manager, cache)
    attach_radix_cache(None, cache)  # canary off: nothing to hand the cache to
    assert manager.radix_cache is cache
