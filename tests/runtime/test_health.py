"""The health check: after warm-up, planned canary passes must show up in the device run counters."""

import pytest

from canary_instrument.runtime import CanaryHealthError, mark_init_finished
from canary_instrument.runtime.step.bracket import unbracket_model_forward

from .mini_engine import MiniRunner, Scheduler, server_args


def _serving(dev, **args):
    runner = MiniRunner(server_args(**args), device=dev)
    sched = Scheduler(runner)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    return runner, sched, reqs


def test_lost_bracket_after_warm_up_raises_one_step_late(dev):
    runner, sched, reqs = _serving(dev, kv_canary_readback_interval=1)  # a tagged snapshot every step
    mark_init_finished(runner.canary_manager)
    runner.forward(sched.extend(reqs))
    runner.forward(sched.decode(reqs, [6, 7]))
    # The wiring gets lost: the model's forward no longer runs the canary passes (as with a graph
    # captured without them), while the outside context still plans every step.
    unbracket_model_forward(runner.model)
    runner.forward(sched.decode(reqs, [8, 9]))  # the step whose kernels did not run
    with pytest.raises(CanaryHealthError, match=r"3 canary sub-forwards were planned .* counted 2 pre-forward"):
        runner.forward(sched.decode(reqs, [10, 11]))


def test_the_health_check_comes_within_the_readback_interval(dev):
    runner, sched, reqs = _serving(dev, kv_canary_readback_interval=4)
    mark_init_finished(runner.canary_manager)
    runner.forward(sched.extend(reqs))  # step 1
    unbracket_model_forward(runner.model)
    runner.forward(sched.decode(reqs, [6, 7]))  # step 2: its kernels do not run
    runner.forward(sched.decode(reqs, [8, 9]))  # step 3
    runner.forward(sched.decode(reqs, [10, 11]))  # step 4: the snapshot that shows it
    with pytest.raises(CanaryHealthError, match=r"4 canary sub-forwards were planned .* counted 1 pre-forward"):
        runner.forward(sched.decode(reqs, [12, 13]))  # step 5 reads step 4's snapshot


def test_health_check_in_log_mode_raises_too(dev):
    runner, sched, reqs = _serving(dev, kv_canary="log")
    mark_init_finished(runner.canary_manager)
    unbracket_model_forward(runner.model)
    runner.forward(sched.extend(reqs))
    with pytest.raises(CanaryHealthError):
        runner.canary_manager.flush()


def test_warm_up_forwards_do_not_count(dev):
    runner, sched, reqs = _serving(dev)
    runner.forward(sched.extend(reqs))  # warm-up before init: kernels launch disabled, nothing planned
    runner.forward(sched.decode(reqs, [6, 7]))
    for r in reqs:
        sched.finish(r)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    runner.forward(sched.extend(reqs))
    for i in range(2):
        runner.forward(sched.decode(reqs, [i, i]))
    assert runner.canary_manager.flush() == []
    stats = runner.canary_manager.stats()
    assert stats.pre_runs == stats.post_runs == 3
