"""End to end: the instrumented reference engine reports every injected fault and nothing else.

Default (CPU) suite, reduced: 2 trials per (layout, EAGLE on/off, fault) and 100 clean
steps per variant. `-m slow`: 50 trials per (layout, EAGLE on/off, fault), so at least
50 per layout and fault, and 2,000 clean steps per variant with prefix sharing, cache
eviction, the SWA window and EAGLE all exercised. On a CUDA machine the same tests run
with CUDA graphs (decode and draft-extend) and the Triton kernels.
"""

import dataclasses

import pytest

from canary_instrument.demo import matrix
from canary_instrument.demo.faults import FAULTS

VARIANTS = matrix.all_variants()


def _describe(result):
    injected = result.injection.description if result.injection else "never injected"
    alarms = "; ".join(v.format() for v in result.false_alarms[:3])
    return f"{result.variant.label} {result.fault} seed {result.seed}: {injected}; false alarms: {alarms or 'none'}"


def _run_matrix(bench, variant, trials, seed_base):
    failures = []
    for fault in matrix.faults_for(variant):
        for trial in range(trials):
            result = bench.run_trial(fault, seed=seed_base + trial)
            if not result.caught:
                failures.append(_describe(result))
            else:
                assert result.delay is not None and result.delay >= 0
                assert set(result.example.reasons) & result.injection.expected_reasons
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.label)
def test_every_fault_is_caught_reduced_matrix(bench_for, variant):
    _run_matrix(bench_for(variant), variant, trials=2, seed_base=100)


@pytest.mark.parametrize("layout", matrix.LAYOUTS)
def test_the_mixed_batch_token_fault_is_caught_only_with_the_token_oracle(bench_for, layout):
    variant = matrix.Variant(layout, False)
    fault = FAULTS["mixed_decode_token"]
    with_oracle = bench_for(variant).run_trial(fault, seed=5)
    assert with_oracle.caught and with_oracle.reasons == {"oracle"} and with_oracle.example.kernel == "token_oracle"
    # The same engine settings without the oracle (the model's own tokens, so another request is hit): the
    # fault is injected, and no check reports anything.
    control = bench_for(variant).run_trial(dataclasses.replace(fault, environ=()), seed=5)
    assert control.injection is not None and "in a mixed batch" in control.injection.description
    assert not control.caught and control.false_alarms == []


@pytest.mark.parametrize("layout", matrix.LAYOUTS)
def test_clean_run_with_the_token_oracle_and_mixed_batches_reports_nothing(engine_module, layout):
    oracle = matrix.EngineBench(engine_module, matrix.Variant(layout, False), enable_mixed_chunk=True,
                                environ={"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"})
    assert oracle.engine.model_runner.canary_manager.token_oracle is not None
    result = oracle.clean_run(100, seed=11)
    assert result.violations == []
    assert result.stats.mixed_batches > 0 and result.stats.chunked_prefills > 0 and result.stats.prefix_hit_tokens > 0


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.label)
def test_clean_run_reports_nothing(bench_for, variant):
    result = bench_for(variant).clean_run(100, seed=7)
    assert result.violations == []
    assert result.stats.prefix_hit_tokens > 0
    if variant.eagle:
        assert result.stats.accepted_drafts > 0
    if variant.layout == "swa":
        assert result.stats.swa_released_tokens > 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.label)
def test_every_fault_is_caught_full_matrix(slow_only, bench_for, variant):
    _run_matrix(bench_for(variant), variant, trials=50, seed_base=10_000)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.label)
def test_long_clean_run_reports_nothing(slow_only, bench_for, variant):
    result = bench_for(variant).clean_run(2000, seed=11)
    assert result.violations == []
    stats = result.stats
    assert stats.prefix_hit_tokens > 0 and stats.evicted_tokens > 0 and stats.chunked_prefills > 0
    if variant.eagle:
        assert 0 < stats.accepted_drafts < stats.proposed_drafts
    if variant.layout == "swa":
        assert stats.swa_released_tokens > 0


def test_a_lasting_corruption_in_a_slot_no_one_holds_is_drawn_again(bench_for):
    """The matrix's rule for perturbations that stay in their slot: one whose slot no running request and no
    prefix-cache node holds after its step (its request finished and the slot was freed) can never be
    reported, so the perturbation is armed again; one in a slot still held is kept, as is one already reported."""
    import random

    from canary_instrument.demo.workload import Workload
    from canary_instrument.runtime.perturb.injection import Injection

    bench = bench_for(matrix.Variant("mha", False))
    bench.reset()
    workload = Workload(bench.engine, random.Random(0))
    for _ in range(8):
        bench.step(workload)
    armed = FAULTS["layer_flip"].arm(bench.engine, random.Random(1))
    try:
        scheduler = bench.engine.scheduler
        req = scheduler.running[0]
        held = int(scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, 0])
        free = int(scheduler.allocator.free_pages[0])

        def flip(slot):
            return Injection(step=1, kind="real_kv_layer", slot=slot, position=0, req=req.req_pool_idx,
                             group="full", half="k")

        assert not armed._unreadable(flip(held), ())
        assert armed._unreadable(flip(free), ())
        reported = bench.flush() + [_reported_fingerprint(req.req_pool_idx)]
        assert not armed._unreadable(flip(free), reported)
    finally:
        armed.disarm()


def _reported_fingerprint(req_pool_index):
    from canary_instrument.runtime.reports.violations import Violation

    return Violation(kernel="pre_forward", group="full", half="k", slot=1, position=0, stored=0, expected=0,
                     reasons=frozenset({"fingerprint"}), req_pool_index=req_pool_index, step=1)
