"""Every perturbation kind at once on the reference engine serving on CPU, with the idle-cache sweep:
each applied injection is reported, and nothing is reported that no injection explains.

This is the CPU twin of the GPU soak: real pools, a real radix cache (prefix sharing, follow-up
turns, chunked prefill, eviction, the SWA window), perturbations and the sweep switched on by
settings and run by the manager at its hook points.
"""

import logging
import random

import pytest

from canary_instrument.demo.workload import Workload
from canary_instrument.runtime.perturb import score
from canary_instrument.runtime.perturb.audit import audit

from .refsgl_harness import instrumented

# Every kind at rate 0.1 from step 6, the way a user switches them on (upstream's variable names).
ALL_KINDS = {"SGLANG_KV_CANARY_PERTURB": "all=0.1", "SGLANG_KV_CANARY_PERTURB_SEED": "11",
             "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "5", "KV_CANARY_SWEEP_SLOTS": "64"}


def perturbed(layout, monkeypatch, environ=ALL_KINDS, sweep_interval=1, device="cpu"):
    """The engine with perturbations and the sweep switched on by settings; the manager runs both."""
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    harness = instrumented(layout, device=device, max_total_tokens=768, max_context_len=256, chunked_prefill_size=48,
                           sliding_window_size=16, kv_canary_sweep_interval=sweep_interval)
    manager = harness.manager
    assert manager.perturber is not None and manager.sweeper is not None
    return harness, manager.perturber, manager.sweeper


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


def check_soak(layout, device, monkeypatch, steps=70):
    """Serve with every kind on, then score: everything applied is reported or provably unreadable."""
    # The ERROR lines are scored here, not printed; monkeypatch turns the logger back on for the tests after.
    monkeypatch.setattr(logging.getLogger("canary_instrument.runtime"), "disabled", True)
    harness, perturber, sweeper = perturbed(layout, monkeypatch, device=device)
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
def test_every_applied_injection_is_reported_and_nothing_else(layout, request, monkeypatch):
    if "slow" in request.keywords and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("runs with the slow tests: select them with -m slow")
    check_soak(layout, "cpu", monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_every_applied_injection_is_reported_on_the_gpu(layout, monkeypatch):
    # The same run with the engine and the canary on CUDA: compiled per-forward and sweep kernels.
    print(f"\n{layout} on cuda:\n{check_soak(layout, 'cuda', monkeypatch).format()}")
