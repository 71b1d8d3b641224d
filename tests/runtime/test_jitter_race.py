"""Jitter turns a latent stream race into a canary violation (GPU).

The fault: each layer's KV write moved to a side stream that waits for the main stream (its K and
V are ready) while the main stream never waits for it before attention and the canary read the
KV: the missing ``main.wait_stream(side)`` of real side-stream code (a KV store overlapped with
compute, a cache load on a copy stream). In a quiet engine the small write lands long before the
post-forward pass fingerprints the slot, so the race is latent: the canary sees nothing (nor,
most of the time, does attention). With jitter at the attention points the write waits a random
while on the side stream, the post-forward pass fingerprints the stale bytes, and the next step's
verify finds the fingerprint wrong. The same fault with the wait in place stays clean under jitter,
so the violations are the race's and not the jitter's.
"""

import pytest
import torch

from canary_instrument.runtime.jitter import JitteredOps

from .refsgl_harness import instrumented

pytestmark = pytest.mark.gpu

STEPS = 16
# Long enough that the side stream's delayed writes trail the host's launches of the reading passes even on a
# busy host (at 1 ms the race stayed hidden on one GPU machine while eight test processes shared its CPU).
JITTER_US = 20_000
PROMPTS = [[(5 * i + j) % 100 + 1 for j in range(24 + 3 * i)] for i in range(8)]


def _kv_write_on_a_side_stream(pool, join: bool) -> None:
    """Run ``pool.set_kv_buffer`` (with its jitter points, when on) on a side stream; ``join`` is the fix."""
    inner = pool.set_kv_buffer
    side = torch.cuda.Stream()

    def set_kv_buffer(*args, **kwargs):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                value.record_stream(side)  # the allocator must not hand K/V to the main stream meanwhile
        with torch.cuda.stream(side):
            inner(*args, **kwargs)
        if join:
            main.wait_stream(side)

    pool.set_kv_buffer = set_kv_buffer


def _run(monkeypatch, jitter_us: int, join: bool):
    if jitter_us:
        monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", str(jitter_us))
        monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_POINTS", "attn_before")
        monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_SEED", "7")
    else:
        monkeypatch.delenv("SGLANG_KV_CANARY_JITTER_MAX_US", raising=False)
    # realkv=all: every layer's row is fingerprinted, so a stale read of any layer's KV write shows.
    h = instrumented("mha", device="cuda", kv_canary_real_kv="all")
    _kv_write_on_a_side_stream(h.engine.model_runner.token_to_kv_pool, join=join)
    h.engine.generate(PROMPTS, max_new_tokens=STEPS)
    torch.cuda.synchronize()
    return h.manager, h.manager.flush()


def test_the_race_is_latent_without_jitter(monkeypatch):
    manager, violations = _run(monkeypatch, jitter_us=0, join=False)
    assert manager.jitter is None
    assert violations == []
    assert manager.stats().post_runs >= STEPS  # the canary ran on every forward and saw nothing


def test_jitter_makes_the_canary_report_the_race(monkeypatch):
    manager, violations = _run(monkeypatch, jitter_us=JITTER_US, join=False)
    assert not isinstance(manager.ops, JitteredOps) and manager.jitter.counts()["attn_before"] > 0
    assert violations, "jitter at the KV write should have exposed the missing stream wait"
    assert "fingerprint" in set().union(*(v.reasons for v in violations)), [v.format() for v in violations[:5]]


def test_with_the_wait_in_place_jitter_reports_nothing(monkeypatch):
    manager, violations = _run(monkeypatch, jitter_us=JITTER_US, join=True)
    assert manager.jitter.totals_us()["attn_before"] > 0
    assert violations == []
