"""The decode step's host work does not grow with the batch in torch calls, and batching the
step's frees changes nothing: the allocators end up exactly as request-by-request frees leave them.

bench/engine/host_step.py measures the same on CPU (time with a stubbed forward, torch calls).
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "engine" / "host_step.py"


@pytest.fixture(scope="module")
def host_step(refsgl):
    spec = importlib.util.spec_from_file_location("bench_host_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("variant", ["mha", "mla", "swa", "mha+eagle", "swa+eagle"])
def test_torch_calls_per_decode_step_do_not_grow_with_the_batch(refsgl, host_step, variant):
    # Same parity: an odd column costs one more (view) call, as the batch's device tensors stay 16-byte aligned.
    small, large = (host_step.count_row(refsgl, variant, bs, context=24) for bs in (2, 8))
    assert small["torch_calls"] == large["torch_calls"], (small["calls"], large["calls"])
    assert small["aten_ops"] == large["aten_ops"]


def test_plain_decode_step_makes_a_handful_of_torch_calls(refsgl, host_step, tmp_path):
    assert host_step.main(["--bs", "3", "--context", "16", "--steps", "3", "--count-bs", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "host_step.json").read_text())["timed"]
    assert row["requests"] == 3 and row["step_us"] > 0
    # Allocation, one req_to_token write, two host-to-device copies, sampling: no per-request calls.
    assert row["torch_calls"] <= 24, row["calls"]
    assert "| 3 x 16 |" in (tmp_path / "host_step.md").read_text()


def allocator_state(allocator) -> dict:
    return {
        "full": allocator.full_attn_allocator.free_pages.tolist(),
        "swa": allocator.swa_attn_allocator.free_pages.tolist(),
        "mapping": allocator.full_to_swa_index_mapping.tolist(),
        "refs": allocator.swa_refs.tolist(),
    }


def make_swa_allocator(refsgl, size: int = 64):
    from refsgl.srt.mem_cache.allocator import SWATokenToKVPoolAllocator
    from refsgl.srt.mem_cache.memory_pool import SWAKVPool

    pool = SWAKVPool(size, size, [1], [0], head_num=1, head_dim=2, dtype=torch.float32, device="cpu")
    return SWATokenToKVPoolAllocator(pool)


@pytest.mark.parametrize("seed", range(5))
def test_free_and_release_swa_matches_frees_run_by_run(refsgl, seed):
    rng = random.Random(seed)
    allocators = [make_swa_allocator(refsgl) for _ in range(2)]
    for allocator in allocators:
        held = allocator.alloc(48)
        allocator.acquire_swa(held[:20])  # a second window hold on some slots
        allocator.free_swa(held[40:44])  # some slots already out of every window
    slots = list(range(1, 49))
    rng.shuffle(slots)
    runs, start = [], 0
    while start < len(slots):
        end = min(len(slots), start + rng.randint(1, 6))
        runs.append((rng.random() < 0.6, torch.tensor(slots[start:end])))
        start = end
    sequential, batched = allocators
    for release, index in runs:
        (sequential.free_swa if release else sequential.free)(index)
    index = torch.cat([index for _, index in reversed(runs)])
    release = torch.cat([torch.full((len(index),), release) for release, index in reversed(runs)])
    assert batched.free_and_release_swa(index, release)
    assert allocator_state(batched) == allocator_state(sequential)


def test_free_and_release_swa_refuses_a_slot_listed_twice(refsgl):
    allocator = make_swa_allocator(refsgl)
    held = allocator.alloc(8)
    allocator.acquire_swa(held)
    before = allocator_state(allocator)
    assert not allocator.free_and_release_swa(torch.tensor([3, 4, 3]), torch.tensor([True, True, True]))
    assert allocator_state(allocator) == before


@pytest.mark.parametrize("layout, eagle", [("swa", False), ("mha", True), ("swa", True)],
                         ids=["swa", "mha+eagle", "swa+eagle"])
def test_step_frees_leave_the_allocators_as_request_by_request_frees(refsgl, layout, eagle):
    """Two engines, one freeing each deferred entry on its own (the pre-batching order): same state every step."""

    def build():
        return refsgl.Engine(
            attention_layout=layout, speculative_algorithm="EAGLE" if eagle else None, device="cpu",
            max_running_requests=6, max_context_len=160, max_total_tokens=300, chunked_prefill_size=40,
            sliding_window_size=8, swa_max_total_tokens=400,
        )

    engines = [build(), build()]
    reference = engines[1].scheduler

    def flush_entry_by_entry():
        pending, reference._pending_frees = reference._pending_frees, []
        for row, start, end in pending:
            reference.allocator.free_swa(reference.req_to_token_pool.req_to_token[row, start:end].long())

    reference._flush_kv_frees = flush_entry_by_entry

    def state(engine):
        scheduler = engine.scheduler
        allocator = scheduler.allocator
        out = allocator_state(allocator) if layout == "swa" else {"full": allocator.free_pages.tolist()}
        out["running"] = [(r.rid, list(r.output_ids)) for r in scheduler.running]
        return out

    rng = random.Random(0)
    for step in range(120):
        if step % 4 == 0:
            # Pairs of equal prompts, often a finished conversation's follow-up: the pair matches the
            # cached conversation, window included, and their windows leave it in the same step.
            done = [r for r in engines[0].scheduler.finished if r.seq_len < 90]
            prompt = rng.choice(done).all_token_ids if done and rng.random() < 0.7 else []
            prompt = prompt + [rng.randrange(128) for _ in range(rng.randint(1, 30))]
            budgets = rng.randint(4, 20), rng.randint(4, 20)
            for engine in engines:
                for budget in budgets:
                    engine.add_request(list(prompt), budget)
        for engine in engines:
            engine.step()
        assert state(engines[0]) == state(engines[1]), f"step {step}"
    stats = engines[0].scheduler.stats
    assert stats.finished_requests > 10 and stats.evicted_tokens > 0
    assert stats.swa_released_tokens > 0 or layout != "swa"
    assert stats.proposed_drafts > stats.accepted_drafts or not eagle
