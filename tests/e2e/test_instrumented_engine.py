"""What a user of the instrumented engine sees: the wiring is in place, raise mode raises, and
the pristine engine has no canary at all."""

import random

import pytest
import torch

from canary_instrument.demo import engine_copy, faults, matrix
from canary_instrument.demo.workload import Workload


def test_cli_instruments_every_site_file(instrumented):
    root, report = instrumented
    changed = {d.path for d in report["apply_diff"]}
    assert changed == {
        "refsgl/srt/managers/scheduler.py",  # the attach_cache hook: apply places it, scaffold has no site there
        "refsgl/srt/model_executor/model_runner.py",
        "refsgl/srt/model_executor/cuda_graph_runner.py",
        "refsgl/srt/speculative/eagle_worker_v2.py",
        "refsgl/srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
    }
    runner = (root / "refsgl/srt/model_executor/model_runner.py").read_text()
    assert "self.canary_manager = install_canary(server_args=self.server_args, model_runner=self)" in runner


def test_each_runner_gets_its_own_manager(engine_module):
    engine = engine_module.Engine(**dict(matrix.ENGINE_DEFAULTS, speculative_algorithm="EAGLE"))
    target, draft = engine.model_runners
    assert target.canary_manager is not None and draft.canary_manager is not None
    assert target.canary_manager is not draft.canary_manager
    assert draft.canary_manager.state.token_offset == 1 and target.canary_manager.state.token_offset == 0
    # speculative_num_steps = 3: the draft chain runs 2 forwards, each with its own sub-forward manager.
    assert draft.canary_manager.num_single_forward == 2


def test_raise_mode_stops_the_engine_at_the_corrupted_step(engine_module):
    engine = engine_module.Engine(**dict(matrix.ENGINE_DEFAULTS, kv_canary="raise"))
    rng = random.Random(3)
    workload = Workload(engine, rng)
    for _ in range(6):
        workload.step()
    armed = faults.FAULTS["remap"].arm(engine, rng)
    from canary_instrument.runtime import CanaryViolationError

    with pytest.raises(CanaryViolationError) as caught:
        for _ in range(10):
            workload.step()
            engine.model_runner.canary_manager.flush()
            armed.poll()
    armed.poll()  # the step that raised made the injection
    assert armed.injection is not None
    assert "position" in str(caught.value)


def test_pristine_engine_has_no_canary(engine_module):
    module = engine_copy.import_engine(engine_copy.pristine_engine_dir())
    engine = module.Engine(**matrix.ENGINE_DEFAULTS)
    assert not hasattr(engine.model_runner, "canary_manager")
    with pytest.raises(RuntimeError, match="no canary manager"):
        matrix.EngineBench(module, matrix.Variant("mha", False))


@pytest.mark.parametrize("layout", matrix.LAYOUTS)
def test_real_kv_all_fingerprints_the_whole_row(engine_module, layout):
    """With kv_canary_real_kv=all a flipped bit anywhere in a layer's row is caught, not only in its first 16 bytes."""
    bench = matrix.EngineBench(engine_module, matrix.Variant(layout, False), kv_canary_real_kv="all")
    for seed in (1, 2, 3):
        result = bench.run_trial(faults.FAULTS["realkv_flip"], seed=seed)
        assert result.caught, result.injection


def _flip_beyond_the_fingerprint(engine, rng, **_):
    """A bit flips in layer 1's K past the first 16 bytes, which realkv=partial does not fingerprint."""
    reqs = [r for r in engine.scheduler.running if r.cached_len > 0]
    if not reqs:
        return None
    req = rng.choice(reqs)
    slot = int(engine.scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, 0])
    row = engine.model_runner.token_to_kv_pool.k_buffer[1][slot].reshape(-1).view(torch.uint8)
    row[row.shape[0] - 1] ^= 1
    return f"layer 1 K of slot {slot}: bit 0 of its last byte flipped", {faults.FINGERPRINT}


def test_a_fault_the_canary_cannot_see_is_reported_missed(engine_module):
    """The judge can fail: a flipped KV bit outside the fingerprinted bytes goes unnoticed, and the trial says so."""
    bench = matrix.EngineBench(engine_module, matrix.Variant("mha", False), kv_canary_real_kv="partial")
    invisible = faults.Fault("beyond_fingerprint", "KV bit flipped past the fingerprinted bytes", "step_end",
                             _flip_beyond_the_fingerprint)
    result = bench.run_trial(invisible, seed=1, max_wait=6)
    assert result.injection is not None
    assert not result.caught and result.detected_step is None
