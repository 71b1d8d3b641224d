"""The Sweeper: the upload of walked rows, its schedule, and the sweep on the reference engine's real cache.

The engine serves on CPU with the canary installed (real pools, real radix cache with prefix
sharing, chunked prefill, eviction and the SWA window); the sweep runs at step end the way the
manager will call it. Clean serving must report nothing; a flipped KV bit in a cached prefix that
no request reads must be reported by the sweep, before any request reuses it.
"""

import random

import pytest
import torch

from canary_instrument.demo.workload import Workload, WorkloadShape
from canary_instrument.runtime.features.radix_walk import FlatRows, Segment, WalkSlice
from canary_instrument.runtime.passes.state import CanaryGroup, CanaryState
from canary_instrument.runtime.features.sweep import Sweeper
from canary_instrument.runtime.features.sweep_reference import TorchSweepOps
from canary_instrument.runtime.features.sweep_triton import TritonSweepOps
from canary_instrument.runtime.reports.violations import Violation

from .radix_trees import CompressedRadixCache
from .refsgl_harness import instrumented


def tiny_state(slots=64):
    return CanaryState(
        layout="mla", realkv="none",
        groups=[CanaryGroup(0, 0, torch.zeros((slots, 4), dtype=torch.int64))],
        req_to_token=torch.zeros((2, 8), dtype=torch.int32), token_offset=0,
        ring=torch.zeros((16, 8), dtype=torch.int64), ring_count=torch.zeros(1, dtype=torch.int64),
    )


def test_send_places_host_and_device_values_in_their_rows():
    sweeper = Sweeper(tiny_state(), interval=1, slots_per_sweep=16)
    piece = WalkSlice(segments=[
        Segment([5, 6, 7], 0, -1),  # host ints from the root
        Segment(torch.tensor([9, 10]), 3, torch.tensor([7])),  # device values, predecessor from the parent node
        Segment(torch.tensor([20]), 2, 4),  # device value, host predecessor
        FlatRows(torch.tensor([30, 31]), torch.tensor([8, 9]), torch.tensor([29, 30])),
        Segment((40,), 11, -1),  # one-slot node (reference engine)
        Segment(torch.tensor([41, 42, 43]), 5, torch.tensor([40])),
    ])
    sweeper.send(piece)
    n = int(sweeper.buffers.count[0])
    assert n == piece.rows == 12
    assert sweeper.buffers.rows[:n].tolist() == [
        [5, 0, -1], [6, 1, 5], [7, 2, 6], [9, 3, 7], [10, 4, 9], [20, 2, 4], [30, 8, 29], [31, 9, 30],
        [40, 11, -1], [41, 5, 40], [42, 6, 41], [43, 7, 42],
    ]
    # A second, smaller slice replaces the first; the count bounds what the kernel reads.
    sweeper.send(WalkSlice(segments=[Segment([3], 0, -1)]))
    assert int(sweeper.buffers.count[0]) == 1 and sweeper.buffers.rows[0].tolist() == [3, 0, -1]
    assert sweeper.progress.rows_sent == 13


def test_schedule_budget_and_bad_settings():
    tree = CompressedRadixCache()
    tree.insert(list(range(10)), list(range(1, 11)))
    sweeper = Sweeper(tiny_state(), interval=3, slots_per_sweep=4)
    sent = [sweeper.maybe_sweep(step, tree) for step in range(1, 10)]
    assert sent == [0, 0, 4, 0, 0, 4, 0, 0, 2]
    assert sweeper.progress.passes == 1 and sweeper.buffers.counters.tolist()[:2] == [3, 10]
    assert Sweeper(tiny_state(), interval=0, slots_per_sweep=4).maybe_sweep(6, tree) == 0
    assert sweeper.maybe_sweep(12, None) == 0
    with pytest.raises(ValueError, match="interval must be >= 0"):
        Sweeper(tiny_state(), interval=-1, slots_per_sweep=4)
    with pytest.raises(ValueError, match="slots per sweep must be >= 1"):
        Sweeper(tiny_state(), interval=1, slots_per_sweep=0)


def test_a_cache_without_a_tree_is_said_once(canary_log):
    class ChunkCache:
        pass

    sweeper = Sweeper(tiny_state(), interval=1, slots_per_sweep=4)
    cache = ChunkCache()
    assert [sweeper.maybe_sweep(s, cache) for s in (1, 2)] == [0, 0]
    assert [r.getMessage() for r in canary_log.records].count(
        "kv_canary sweep: ChunkCache holds no prefix tree; nothing to sweep") == 1


def _serve(harness, steps, seed, **shape):
    workload = Workload(harness.engine, random.Random(seed), WorkloadShape(**shape))
    for _ in range(steps):
        workload.step()


def _sweep_pass(harness, sweeper):
    """Sweep slices until a pass over the (now idle) cache completes; returns the violations read."""
    passes = sweeper.progress.passes
    step = harness.manager.step
    while sweeper.progress.passes == passes:
        step += sweeper.interval
        sweeper.maybe_sweep(step, harness.tree_cache)
    return harness.manager.flush()


def _idle_cached_slots(cache):
    slots, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        if node.lock_ref == 0:
            slots.append(node.slot)
        stack.extend(node.children.values())
    return slots


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_sweep_during_serving_is_clean_and_finds_a_flipped_cached_bit(layout):
    harness = instrumented(layout, max_total_tokens=768, max_context_len=256, chunked_prefill_size=48,
                           sliding_window_size=16)
    sweeper = Sweeper(harness.manager.state, interval=2, slots_per_sweep=40)
    harness.hooks.step_end.append(lambda: sweeper.maybe_sweep(harness.manager.step, harness.tree_cache))
    _serve(harness, 60, seed=layout)  # shared prompts, follow-ups, chunked prefill, eviction, SWA window
    assert harness.manager.flush() == []
    assert sweeper.progress.passes >= 1 and sweeper.buffers.counters[1] > 100

    harness.engine.scheduler.abort_all_requests()
    idle = _idle_cached_slots(harness.tree_cache)
    assert len(idle) > 50
    assert _sweep_pass(harness, sweeper) == []

    slot = random.Random(1).choice(idle)
    pool = harness.engine.model_runner.token_to_kv_pool
    layer0 = (pool.full_kv_pool.k_buffer if layout == "swa" else pool.kv_buffer if layout == "mla" else pool.k_buffer)[0]
    layer0[slot].reshape(-1).view(torch.uint8)[3] ^= 0x04  # inside the 16 fingerprinted bytes
    found = _sweep_pass(harness, sweeper)
    assert {(v.kernel, v.group, v.half, v.slot, tuple(sorted(v.reasons)), v.req_pool_index) for v in found} == {
        ("sweep", "full", "k", slot, ("fingerprint",), -1)
    }


def test_the_triton_sweep_on_the_engine_cache_matches_the_reference(device):
    harness = instrumented("swa", device=device, max_total_tokens=512, max_context_len=128, chunked_prefill_size=32,
                           sliding_window_size=8)
    _serve(harness, 30, seed=5, concurrency=3, max_new_tokens=(4, 10))
    harness.engine.scheduler.abort_all_requests()
    state = harness.manager.state
    mapping, rows = state.swa_mapping, state.groups[2].rows
    mapped = [s for s in _idle_cached_slots(harness.tree_cache) if int(mapping[s]) != 0]
    rows[int(mapping[mapped[0]]), 1] += 1  # a wrong position in the SWA group of a cached slot
    ring_before = int(state.ring_count[0])
    results = []
    for ops in (TorchSweepOps(), TritonSweepOps(block=16, programs=3)):
        state.ring_count[0] = ring_before
        sweeper = Sweeper(state, interval=1, slots_per_sweep=1000, ops=ops)
        sweeper.maybe_sweep(1, harness.tree_cache)
        count = int(state.ring_count[0]) - ring_before
        records = sorted(tuple(r) for r in state.ring[ring_before: ring_before + count].tolist())
        results.append((records, sweeper.buffers.counters.tolist()))
    assert results[0] == results[1]
    reported = [Violation.from_record(r, 0) for r in results[0][0]]
    assert {(v.group, v.slot, tuple(sorted(v.reasons))) for v in reported} >= {
        ("swa", int(mapping[mapped[0]]), ("position",))
    }
