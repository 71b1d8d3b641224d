"""EAGLE under CUDA graphs: the multi-step draft chain, the target verify and the draft-extend all replay
from graphs, and the engine gives the greedy tokens it gives eagerly.

Every decode step of an EAGLE engine runs a draft chain, a verify and a draft-extend; with
graphs on and batches within `cuda_graph_max_bs`, each must be a replay, never an eager fallback.
Requests finish at different steps, so the batch shrinks through sizes that are padded to a captured
one (padding rows at req-pool row 0).
"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.gpu

ENGINE = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_running_requests=8, max_context_len=256, max_total_tokens=2048,
    chunked_prefill_size=512, sliding_window_size=12, cuda_graph_max_bs=8, device="cuda",
)


def prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(128) for _ in range(rng.randint(4, 40))] for _ in range(n)]


def count_calls(obj, name: str) -> list:
    """Wrap ``obj.<name>`` on the instance; the returned list gets one entry per call."""
    calls = []
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(obj, name, wrapper)
    return calls


def run(refsgl, graphs: bool, **overrides):
    """(outputs, replay counts, eager draft chains, decode steps) of a two-round workload."""
    engine = refsgl.Engine(**dict(ENGINE, speculative_algorithm="EAGLE", disable_cuda_graph=not graphs, **overrides))
    worker = engine.spec_worker
    runners = {
        "verify": engine.model_runner.graph_runner,
        "draft": worker.cuda_graph_runner,
        "draft_extend": worker.cuda_graph_runner_for_draft_extend,
    }
    if graphs:
        assert all(r is not None for r in runners.values()), runners
        replays = {name: count_calls(r, "replay") for name, r in runners.items()}
    else:
        assert all(r is None for r in runners.values()), runners
        replays = {}
    # The graph runner captured draft_forward itself; this counts only the eager fallback in draft().
    eager_chains = count_calls(worker, "draft_forward")
    outputs = engine.generate(prompts(1, 8), 20) + engine.generate(prompts(2, 5), 12)
    return outputs, {k: len(v) for k, v in replays.items()}, len(eager_chains), engine.scheduler.stats


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attention_layout="mha"),
        dict(attention_layout="mla"),
        dict(attention_layout="swa"),
        dict(attention_layout="mha", speculative_num_steps=1),  # a chain with no draft forward
        dict(attention_layout="mha", speculative_num_steps=2),
        dict(attention_layout="mha", speculative_num_steps=5),
        dict(attention_layout="mha", attention_backend="torch_native"),  # metadata planned once for the chain
    ],
    ids=["mha", "mla", "swa", "mha-steps1", "mha-steps2", "mha-steps5", "mha-torch-native"],
)
def test_graphs_give_the_eager_tokens_and_replace_every_eager_forward(refsgl, overrides):
    eager, _, eager_chains, eager_stats = run(refsgl, graphs=False, **overrides)
    graphed, replays, graph_eager_chains, stats = run(refsgl, graphs=True, **overrides)
    assert graphed == eager
    assert stats.proposed_drafts == eager_stats.proposed_drafts and stats.accepted_drafts == eager_stats.accepted_drafts
    assert eager_chains == eager_stats.decode_batches > 0
    # Every decode step replayed all three graphs and ran no draft chain eagerly.
    assert replays == {"verify": stats.decode_batches, "draft": stats.decode_batches,
                       "draft_extend": stats.decode_batches}
    assert graph_eager_chains == 0


def test_a_batch_above_the_captured_sizes_runs_eagerly_with_the_same_tokens(refsgl):
    """cuda_graph_max_bs below the batch: steps with more requests fall back to eager forwards."""
    eager, _, _, _ = run(refsgl, graphs=False)
    graphed, replays, eager_chains, stats = run(refsgl, graphs=True, cuda_graph_max_bs=4)
    assert graphed == eager
    assert 0 < replays["draft"] < stats.decode_batches
    assert replays["draft"] + eager_chains == stats.decode_batches
    assert replays["verify"] == replays["draft"] == replays["draft_extend"]
