"""The demo's HiCache rows: on the instrumented reference engine with its host tier, each host-tier fault is caught
with the runtime's sidecar, and without it the canary reports at the fault's read exactly what it reports for the
same steps without the fault; clean load-backs read clean only with the sidecar; SWA is refused. On CPU (the
demo's device) and, where one is visible, on CUDA (Triton passes, CUDA graphs, the host pool in host memory)."""

import logging

import pytest
import torch

from canary_instrument.demo import engine_copy, hicache_trials, matrix
from canary_instrument.demo.faults import FAULTS

HICACHE_FAULTS = [FAULTS["hicache_host_copy"], FAULTS["hicache_load_slots"]]
LAYOUTS = ("mha", "mla")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.fixture(scope="module")
def engine_module(tmp_path_factory):
    root = engine_copy.copy_engine(tmp_path_factory.mktemp("hicache") / "engine")
    engine_copy.instrument(root)
    runtime_log, threads = logging.getLogger("canary_instrument.runtime"), torch.get_num_threads()
    level = runtime_log.level
    matrix.quiet_canary_log()
    torch.set_num_threads(1)
    yield engine_copy.import_engine(root)
    runtime_log.setLevel(level)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def benches(engine_module):
    """Per (device, layout), the matrix's bench of an engine with the host tier (the HiCache faults' sibling),
    built on first use."""
    made = {}

    def bench(device, layout):
        if (device, layout) not in made:
            base = matrix.EngineBench(engine_module, matrix.Variant(layout, False), device=device)
            made[device, layout] = base.bench_for(HICACHE_FAULTS[0])
        return made[device, layout]

    return bench


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fault", HICACHE_FAULTS, ids=lambda f: f.name)
def test_a_host_tier_fault_is_caught_with_the_sidecar_and_missed_without(benches, device, layout, fault):
    bench = benches(device, layout)
    assert bench.engine.server_args.enable_hierarchical_cache
    for seed in range(3):
        trial = bench.run_trial(fault, seed)
        assert trial.caught, (seed, trial.injection, [v.format() for v in trial.false_alarms[:3]])
        assert trial.reasons & fault.expected and trial.delay >= 0
    control = hicache_trials.control_trial(bench.fresh, fault, seed=0)
    assert control.injection is not None
    assert control.at_fault, "the canary without the sidecar reports the load-back itself"
    assert control.missed  # ... and nothing the fault changed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_clean_load_backs_read_clean_only_with_the_sidecar(benches, device, layout):
    run = hicache_trials.run_layout(benches(device, layout), [], hicache_trials.MIN_CLEAN_STEPS, seed=0)
    assert run.host_pool == {"mha": "MHATokenToKVPoolHost", "mla": "MLATokenToKVPoolHost"}[layout]
    assert run.loaded_back > 0
    assert run.with_sidecar.violations == []
    assert run.without_sidecar.violations


def test_hicache_of_an_swa_pool_is_refused_by_the_runtime(engine_module):
    message = hicache_trials.swa_refusal(engine_module, matrix.ENGINE_DEFAULTS)
    assert "HiCache of the SWA pool" in message and "full-attention KV only" in message


def test_the_faults_run_where_the_runtime_follows_the_host_tier():
    for fault in HICACHE_FAULTS:
        assert fault.applies("mha", False) and fault.applies("mla", False)
        assert not fault.applies("swa", False) and fault.refused("swa", False)
        assert not any(fault.applies(layout, True) or fault.refused(layout, True) for layout in matrix.LAYOUTS)
