"""Timing jitter in the engine instrumented by the real CLI: both runners of an EAGLE engine get their own
jitter, a clean run stays clean, and (GPU) the waits recorded in the CUDA graphs draw afresh on every replay."""

import pytest
import torch

from canary_instrument.demo import matrix
from canary_instrument.runtime.features.jitter import LAST, POINT_ID, TOTAL, draw_ns, runner_seed

SEED = 11
MAX_US = 5
PROMPTS = [[(3 * i + j) % 120 + 1 for j in range(10 + 2 * i)] for i in range(4)]


def _engine(engine_module, monkeypatch, **overrides):
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", str(MAX_US))
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_SEED", str(SEED))
    return engine_module.Engine(**dict(matrix.ENGINE_DEFAULTS, **overrides))


def _check_draws(manager, seed):
    jitter = manager.jitter
    counts = jitter.counts()
    assert counts["pre_before"] == counts["post_after"] == manager.stats().pre_runs > 0
    for name, point in POINT_ID.items():
        draws = [draw_ns(seed, c, point, MAX_US * 1000) for c in range(counts[name])]
        assert jitter.state[TOTAL, point].item() == sum(draws), name
        assert jitter.state[LAST, point].item() == (draws[-1] if draws else 0), name


@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_both_eagle_runners_wait_with_their_own_seeds_and_stay_clean(engine_module, monkeypatch, layout):
    engine = _engine(engine_module, monkeypatch, attention_layout=layout, speculative_algorithm="EAGLE")
    target, draft = (r.canary_manager for r in engine.model_runners)
    engine.generate(PROMPTS, max_new_tokens=6)
    for manager in (target, draft):
        assert manager.flush() == []
    _check_draws(target, runner_seed(SEED, is_draft=False))
    _check_draws(draft, runner_seed(SEED, is_draft=True))
    layers = matrix.ENGINE_DEFAULTS["num_hidden_layers"]
    assert target.jitter.counts()["attn_before"] == layers * target.stats().pre_runs


@pytest.mark.gpu
@pytest.mark.parametrize("eagle", [False, True])
def test_graph_replays_draw_fresh_waits_and_stay_clean(engine_module, monkeypatch, eagle):
    extra = dict(speculative_algorithm="EAGLE") if eagle else {}
    engine = _engine(engine_module, monkeypatch, attention_layout="mha", device="cuda", **extra)
    replays = []
    runner = engine.model_runner.graph_runner
    assert runner is not None, "the target's decode (or verify) forward should be captured"
    original = runner.replay
    runner.replay = lambda *a, **kw: replays.append(1) or original(*a, **kw)
    engine.generate(PROMPTS, max_new_tokens=8)
    torch.cuda.synchronize()
    managers = [r.canary_manager for r in engine.model_runners]
    for manager in managers:
        assert manager.flush() == []
    assert replays, "no forward replayed a CUDA graph"
    _check_draws(managers[0], runner_seed(SEED, is_draft=False))
    if eagle:
        _check_draws(managers[1], runner_seed(SEED, is_draft=True))
