"""The demo's jitter row: the race of ``demo/jitter_race.py`` on the demo's own instrumented engine (GPU), and
on CPU the reason it is not run."""

import pytest
import torch

from canary_instrument.demo import engine_copy, jitter_race


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the race runs")
def test_without_cuda_the_race_is_not_run_and_says_why():
    assert jitter_race.unavailable() == "needs CUDA streams (no CUDA device here)"


@pytest.mark.gpu
def test_the_demo_engine_shows_the_race_only_with_jitter(tmp_path):
    root = engine_copy.copy_engine(tmp_path / "engine")
    engine_copy.instrument(root)
    module = engine_copy.import_engine(root)

    def make(args):
        engine = module.Engine(**args)
        return engine, engine.model_runner.canary_manager

    quiet, jittered, joined = runs = jitter_race.run_all(make)
    assert quiet.manager.jitter is None and quiet.violations == []
    assert jittered.manager.jitter.counts()["attn_before"] > 0 and "fingerprint" in jittered.reasons
    assert joined.manager.jitter.totals_us()["attn_before"] > 0 and joined.violations == []
    assert jitter_race.as_expected(runs)
