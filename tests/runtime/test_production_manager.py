"""The production features as the manager runs them: the idle-cache sweep at step end over the cache the
scheduler handed over, the kv_canary_stats= line with sweep progress and reasons, perturbations switched on
by settings (target manager only) and undone when a forward fails."""

import pytest
import torch
from kernels.scenario import make_scenario

from canary_instrument.runtime.manager import CanaryManager
from canary_instrument.runtime.passes.ops import get_ops
from canary_instrument.runtime.perturb import PerturbSettings
from canary_instrument.runtime.setup.settings import CanarySettings
from canary_instrument.runtime.reports.stats import StatsLine

from .refsgl_harness import instrumented


def test_the_sweep_finds_a_flipped_cached_bit_at_step_end_and_the_stats_line_counts_it(monkeypatch, canary_log):
    monkeypatch.setenv("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "1")
    harness = instrumented("mha", kv_canary_sweep_interval=1)
    manager, engine = harness.manager, harness.engine
    assert manager.radix_cache is engine.scheduler.tree_cache and manager.sweeper is not None
    engine.generate([[5, 6, 7, 8, 9, 10, 11, 12]], max_new_tokens=4)  # finished: its KV sits in the cache, idle
    assert manager.flush() == []
    slot = int(engine.scheduler.req_to_token_pool.req_to_token[engine.scheduler.finished[0].req_pool_idx, 3])
    engine.model_runner.token_to_kv_pool.k_buffer[0][slot].reshape(-1).view(torch.uint8)[2] ^= 0x10
    engine.generate([[90, 91, 92]], max_new_tokens=2)  # no shared prefix: only the sweep reads the slot
    found = manager.flush()
    assert {(v.kernel, v.group, v.half, v.slot, v.position, tuple(v.reasons), v.req_pool_index) for v in found} >= {
        ("sweep", "full", "k", slot, 3, ("fingerprint",), -1)
    }
    assert all(v.kernel == "sweep" for v in found)
    last = StatsLine.find_all(canary_log.text)[-1]
    assert last.reason_count("fingerprint") == len(found) and last.violations == len(found)
    assert last.swept > 0 and last.sweep_passes >= 1 and last.step == manager.step
    assert last.pre_runs == last.post_runs == manager.step


def test_a_draft_manager_gets_neither_perturbations_nor_a_sweep():
    settings = CanarySettings(mode="log", real_kv="partial", sweep_interval=1,
                              perturb=PerturbSettings(rates=(("req_to_token", 1.0),)))

    def manager(token_offset):
        sc = make_scenario("mha", "partial", seed=1, token_offset=token_offset)
        return CanaryManager(settings=settings, state=sc.state, ops=get_ops("cpu", "torch"), device="cpu",
                             num_single_forward=1)

    target, draft = manager(0), manager(1)
    assert target.perturber is not None and target.sweeper is not None
    assert draft.perturber is None and draft.sweeper is None
    assert CanaryManager(settings=CanarySettings(mode="log"), state=make_scenario("mha").state,
                         ops=get_ops("cpu", "torch"), device="cpu", num_single_forward=1).sweeper is None


def test_a_perturbation_is_undone_when_the_forward_fails(monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_PERTURB", "req_to_token=1")
    monkeypatch.setenv("SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS", "0")
    harness = instrumented("mha")
    engine, perturber = harness.engine, harness.manager.perturber
    engine.generate([[1, 2, 3, 4, 5, 6]], max_new_tokens=2)
    table = engine.scheduler.req_to_token_pool.req_to_token

    def fail(forward_batch):
        raise RuntimeError("the model failed")

    harness.hooks.before_forward.append(fail)  # runs after the perturbation, inside the outside-graph context
    engine.add_request([1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=2)  # a prefix hit: positions to remap
    with pytest.raises(RuntimeError, match="the model failed"):
        engine.step()
    [injection] = [i for i in perturber.drain() if i.step == harness.manager.step + 1]
    assert injection.applied and int(table[injection.req, injection.position]) == injection.slot


def test_with_a_readback_interval_stats_steps_force_a_snapshot_and_the_line_carries_that_steps_sweep(
    monkeypatch, canary_log
):
    """kv_canary_readback_interval=5 with stats every 3 steps: a snapshot on steps 5, 10, ... and on every stats
    step, so each stats line is that step's (device counters and sweep progress), and the enable warning settles
    from the sparse snapshots without a word."""
    monkeypatch.setenv("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "3")
    monkeypatch.setenv("KV_CANARY_READBACK_INTERVAL", "5")
    monkeypatch.setenv("KV_CANARY_SWEEP_SLOTS", "4")  # a few rows per slice: passes span several steps
    harness = instrumented("mha", kv_canary_sweep_interval=1)
    manager, engine = harness.manager, harness.engine
    taken, take = [], manager._readback.take
    monkeypatch.setattr(manager._readback, "take", lambda tag: taken.append(tag) or take(tag))
    engine.generate([[5, 6, 7, 8, 9, 10, 11, 12]], max_new_tokens=4)  # leaves a cached prefix to sweep
    engine.generate([[1, 2, 3], [1, 2, 3, 4, 5, 6]], max_new_tokens=30)
    steps = manager.step
    assert steps >= 33
    assert [t.step for t in taken] == [s for s in range(1, steps + 1) if s % 5 == 0 or s % 3 == 0]
    assert all(t.sweep_progress is not None for t in taken if t.step % 3 == 0)
    lines = StatsLine.find_all(canary_log.text)
    due = [s for s in range(3, steps, 3)]  # the last due step's snapshot may still be on its way
    assert [line.step for line in lines][: len(due)] == due
    by_step = {t.step: t.sweep_progress for t in taken}
    for line in lines:
        assert (line.sweep_passes, line.sweep_pass_rows) == by_step[line.step]
        assert line.pre_runs == line.post_runs == line.step and line.violations == 0
    assert lines[-1].swept > 0 and max(line.sweep_passes for line in lines) >= 1
    assert manager.health.warning_done  # settled: kernels were seen running
    assert [r for r in canary_log.records if r.levelname in ("WARNING", "ERROR")] == []
