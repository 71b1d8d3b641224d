"""Every perturbation kind at once on the reference engine serving on CPU, with the idle-cache sweep:
each applied injection is reported, and nothing is reported that no injection explains.

This is the CPU twin of the GPU soak: real pools, a real radix cache (prefix sharing, follow-up
turns, chunked prefill, eviction, the SWA window), the hooks where the manager will call them.
"""

import logging
import random

import pytest

from canary_instrument.demo.workload import Workload
from canary_instrument.runtime.perturb import PerturbSettings, score
from canary_instrument.runtime.perturb.audit import audit
from canary_instrument.runtime.perturb.perturber import ManagerView, Perturber
from canary_instrument.runtime.sweep import Sweeper

from .refsgl_harness import instrumented


def perturbed(layout, settings, sweep_interval=1, sweep_slots=64, device="cpu"):
    harness = instrumented(layout, device=device, max_total_tokens=768, max_context_len=256, chunked_prefill_size=48,
                           sliding_window_size=16)
    manager = harness.manager
    perturber = Perturber(settings, manager.state)
    sweeper = Sweeper(manager.state, interval=sweep_interval, slots_per_sweep=sweep_slots)

    def view(offset):
        return ManagerView(step=manager.step + offset, radix_cache=harness.tree_cache)

    # Inside the step's outside-graph context the step is not counted yet: its forward carries step + 1.
    harness.hooks.before_forward.append(lambda fb: perturber.before_forward(view(1), fb))
    harness.hooks.after_forward.append(lambda fb: perturber.after_forward(view(1), fb))
    harness.hooks.step_end.append(lambda: perturber.at_step_end(view(0)))
    harness.hooks.step_end.append(lambda: sweeper.maybe_sweep(manager.step, harness.tree_cache))
    return harness, perturber, sweeper


def serve(harness, steps, seed):
    workload = Workload(harness.engine, random.Random(seed))
    for _ in range(steps):
        workload.step()


def drain_cache(harness, sweeper, extra_steps):
    """Stop admitting, let running requests finish (their KV goes into the cache), then let the sweep
    finish two passes over what the cache holds."""
    while not harness.engine.scheduler.is_idle():
        harness.engine.step()
    passes = sweeper.progress.passes
    step = harness.manager.step
    while sweeper.progress.passes < passes + 2 and extra_steps > 0:
        step += 1
        sweeper.maybe_sweep(step, harness.tree_cache)
        extra_steps -= 1


# MLA (one canary group, the latent row) adds little over MHA here and runs with the slow tests.
ALL_KINDS = PerturbSettings(
    rates=(("req_to_token", 0.1), ("real_kv_used", 0.1), ("real_kv_unused_cache", 0.1),
           ("real_kv_post_forward", 0.1), ("next_token_swap", 0.1)),
    seed=11, warmup_steps=5,
)


def check_soak(layout, device, steps=70):
    """Serve with every kind on, then score: everything applied is reported or provably unreadable."""
    logging.getLogger("canary_instrument.runtime").setLevel(logging.CRITICAL)  # the ERROR lines are scored here
    harness, perturber, sweeper = perturbed(layout, ALL_KINDS, device=device)
    serve(harness, steps, seed=layout)
    drain_cache(harness, sweeper, extra_steps=400)
    violations = harness.manager.flush()
    injections = perturber.drain()
    result = score(injections, violations)
    assert result.injected >= 15, result.format()
    assert all(k.injected >= 1 for k in result.kinds.values()), result.format()
    assert result.unattributed == [], result.format() + "".join(f"\n{v.format()}" for v in result.unattributed[:10])
    # A miss is only acceptable where nothing could read the corruption any more (the slot was freed).
    why = audit(result, harness.manager.state, harness.tree_cache)
    assert why["undetected"] == [], result.format() + "".join(f"\nmissed: {m.format()}" for m in why["undetected"])
    assert result.reported >= 0.8 * result.injected, result.format()
    return result


# MLA (one canary group, the latent row) adds little over MHA here and runs with the slow tests.
@pytest.mark.parametrize("layout", ["mha", pytest.param("mla", marks=pytest.mark.slow), "swa"])
def test_every_applied_injection_is_reported_and_nothing_else(layout, request):
    if "slow" in request.keywords and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("runs with the slow tests: select them with -m slow")
    check_soak(layout, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_every_applied_injection_is_reported_on_the_gpu(layout):
    # The same run with the engine and the canary on CUDA: compiled per-forward and sweep kernels.
    print(f"\n{layout} on cuda:\n{check_soak(layout, 'cuda').format()}")
