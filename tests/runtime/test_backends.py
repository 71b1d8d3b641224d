"""The runtime drives both kernel backends the same way: identical findings on every layout."""

import os

import pytest

from canary_instrument.runtime import mark_init_finished

from .mini_engine import MiniRunner, Scheduler, server_args


def _findings(layout, backend, dev):
    runner = MiniRunner(server_args(kv_canary_backend=backend), layout=layout, device=dev)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([1, 2, 3, 4, 5]), sched.new_request([6, 7, 8])]
    runner.forward_and_sample(sched.extend(reqs), [10, 20])
    for i in range(3):
        runner.forward_and_sample(sched.decode(reqs, [10 + i, 20 + i]), [11 + i, 21 + i])
    clean = runner.canary_manager.flush()
    batch = sched.decode(reqs, [13, 23])
    batch.input_ids = batch.input_ids.flip(0)  # each request fed the other's sampled token
    runner.req_to_token_pool.req_to_token[reqs[0].row, 6] = reqs[1].slots[4]  # remapped, other position
    pool = runner.token_to_kv_pool
    layer0 = pool.kv_buffer[0] if layout == "mla" else (pool.full_kv_pool if layout == "swa" else pool).k_buffer[0]
    layer0[reqs[1].slots[1]].view(-1)[0] += 1.0  # flipped real-KV bytes
    runner.forward_and_sample(batch, [14, 24])
    runner.forward(sched.decode(reqs, [14, 24]))
    return clean, runner.canary_manager.flush(), runner.canary_manager.stats()


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_triton_and_torch_backends_agree(layout, dev, monkeypatch):
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton runs CPU tensors only through its interpreter, which is off where CUDA is visible")
    monkeypatch.delenv("KV_CANARY_BACKEND", raising=False)
    clean_t, found_t, stats_t = _findings(layout, "torch", dev)
    clean_k, found_k, stats_k = _findings(layout, "triton", dev)
    assert clean_t == clean_k == []
    assert sorted(map(repr, found_k)) == sorted(map(repr, found_t))
    assert stats_k == stats_t
    reasons = set().union(*(v.reasons for v in found_t))
    assert {"fingerprint", "token", "position"} <= reasons
    assert {v.position for v in found_t if "fingerprint" in v.reasons} == {1}


@pytest.mark.gpu
def test_the_first_launch_of_a_kind_compiles_every_batch_bucket(monkeypatch):
    """Growing batches of an eager forward compile nothing new: the first launch of each kind compiled
    every plan width up to the req pool's size (no serving step stops to compile a new batch bucket)."""
    import torch
    import triton

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; none is visible")
    monkeypatch.delenv("KV_CANARY_BACKEND", raising=False)
    compiles = []  # (kernel, compiled ahead of a launch) for every kernel Triton had to compile or load

    def hook(*, fn, is_manual_warmup, **_):
        compiles.append((fn.name, is_manual_warmup))

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", hook)
    runner = MiniRunner(server_args(kv_canary_backend="triton"), device="cuda", max_reqs=100, size=2048)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    first = [sched.new_request([1, 2, 3])]
    runner.forward_and_sample(sched.extend(first), [7])
    runner.forward_and_sample(sched.decode(first, [7]), [8])
    ahead = {name for name, warmup in compiles if warmup}
    assert {"canary_pre_forward", "canary_post_forward"} <= ahead
    compiles.clear()
    reqs = first + [sched.new_request([5, 6]) for _ in range(70)]  # 128 lanes, then 71 requests decoding
    runner.forward_and_sample(sched.extend(reqs[1:]), list(range(70)))
    runner.forward_and_sample(sched.decode(reqs, [8, *range(70)]), [3] * 71)  # each fed its sampled token
    assert [c for c in compiles if c[0] in ("canary_pre_forward", "canary_post_forward")] == []
    assert runner.canary_manager.flush() == []
