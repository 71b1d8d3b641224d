"""Timing jitter on sglang 0.5.20's real pools: the attention points wrap the real pool's ``set_kv_buffer``
(what sglang's attention backends call), every point runs once per canary pass or layer write, and a clean
run stays clean under jitter."""

from __future__ import annotations

import pytest

from canary_instrument.runtime.features.jitter import JitteredOps, draw_ns, POINT_ID, TOTAL

from .harness import LAYERS
from .test_real_serving import _prefill_and_decode, _serving, dev, server_args  # noqa: F401 (fixtures)


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_jitter_points_on_real_pools_with_a_clean_run(sg, server_args, layout, dev, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "10")
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_SEED", "3")
    runner, sched = _serving(sg, server_args, layout, dev=dev)
    manager = runner.canary_manager
    assert isinstance(manager.ops, JitteredOps)
    assert "set_kv_buffer" in vars(runner.token_to_kv_pool)  # on the instance the model writes through
    _prefill_and_decode(sched, [[5, 6, 7, 8, 9], [11, 12, 13]], steps=4)
    assert manager.flush() == []
    forwards = manager.stats().pre_runs
    counts = manager.jitter.counts()
    assert counts == {"pre_before": forwards, "pre_after": forwards, "attn_before": LAYERS * forwards,
                      "attn_after": LAYERS * forwards, "post_before": forwards, "post_after": forwards}
    point = POINT_ID["attn_after"]
    assert manager.jitter.state[TOTAL, point].item() == sum(
        draw_ns(3, c, point, 10_000) for c in range(counts["attn_after"]))
