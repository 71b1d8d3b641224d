"""On a GPU: the perturbation hooks and the sweep never synchronise the host with the device, and the sweep
kernel replays in a CUDA graph with rows staged after capture."""

import pytest
import torch
from kernels.scenario import make_scenario, to_device, violations

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.features import sweep_reference
from canary_instrument.runtime.perturb import KINDS, PerturbSettings, score
from canary_instrument.runtime.perturb.perturber import ManagerView, Perturber
from canary_instrument.runtime.features.radix_walk import Segment, WalkSlice
from canary_instrument.runtime.features.sweep import Sweeper
from canary_instrument.runtime.features.sweep_buffers import SweepBuffers
from canary_instrument.runtime.features.sweep_triton import TritonSweepOps

from .radix_trees import CompressedRadixCache
from .test_perturb_kinds import forward_batch, records
from .test_perturb_request_side import with_request_side

pytestmark = pytest.mark.gpu


class no_host_sync:
    """torch raises on any operation that would make the host wait for the device."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        return False


def cuda_scenario(layout, decode):
    return make_scenario(layout, "partial", True, seed=4, num_reqs=3, max_bs=4, prefix_lens=[12, 7, 9],
                         extend_lens=[1, 1, 1] if decode else [3, 1, 4], swa_window=5, max_context=40,
                         full_slots=128, swa_slots=64, unfingerprinted=0.0, share_prefix=False, device="cuda")


def _to_cuda(fb):
    for name in ("input_ids", "req_pool_indices", "seq_lens", "positions", "out_cache_loc"):
        setattr(fb, name, getattr(fb, name).cuda())
    return fb


@pytest.mark.parametrize("layout", ["mha", "swa"])
@pytest.mark.parametrize("decode", [False, True])
def test_hooks_and_sweep_run_without_a_host_sync(layout, decode):
    sc = cuda_scenario(layout, decode)
    fb = _to_cuda(forward_batch(sc, decode=decode))
    with_request_side(sc, fb)  # identity entries, out_cache_loc and the free queue, as a target's manager keeps
    cache = CompressedRadixCache(device="cuda")
    for req in sc.requests:
        cache.insert(req.tokens[: req.prefix], req.full_slots[: req.prefix])
    perturber = Perturber(PerturbSettings(rates=tuple((k, 1.0) for k in KINDS), seed=2, warmup_steps=0), sc.state)
    sweeper = Sweeper(sc.state, interval=1, slots_per_sweep=16)
    view = ManagerView(step=1, radix_cache=cache)
    with no_host_sync():
        perturber.before_forward(view, fb)
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    reference.post_forward(sc.state, sc.plan)
    with no_host_sync():
        perturber.after_forward(view, fb)
        perturber.at_step_end(view)
        sweeper.maybe_sweep(1, cache)
    injections = perturber.drain()
    # next_token_swap acts on running requests (decode, verify) only; req_row_swap too, and it yields the
    # forward to req_to_token (one rewrite of the table per forward).
    skipped = {"req_row_swap"} | ({"next_token_swap"} if not decode else set())
    assert {i.kind for i in injections} == set(KINDS) - skipped
    found = records(sc.state, 1)
    same_forward = ("req_to_token", "real_kv_used", "next_token_swap", "req_row_swap", "write_slot")
    result = score([i for i in injections if i.kind in same_forward], found)
    assert result.reported == result.injected > 0
    if decode:
        swap = Perturber(PerturbSettings(rates=(("req_row_swap", 1.0),), seed=2, warmup_steps=0), sc.state)
        with no_host_sync():
            swap.before_forward(ManagerView(step=2), fb)
            swap.after_forward(ManagerView(step=2), fb)
        assert [i.kind for i in swap.drain()] == ["req_row_swap"]


def test_sweep_kernel_replays_in_a_cuda_graph_with_rows_staged_after_capture():
    sc = cuda_scenario("swa", decode=False)
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    reference.post_forward(sc.state, sc.plan)
    sweeper = Sweeper(sc.state, interval=1, slots_per_sweep=64, ops=TritonSweepOps())
    sweeper.send(WalkSlice(segments=[]))  # nothing to verify at capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sweeper.ops.sweep(sc.state, sweeper.buffers)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        sweeper.ops.sweep(sc.state, sweeper.buffers)
    sc.state.ring_count.zero_()
    sweeper.buffers.counters.zero_()
    slots = sc.requests[0].full_slots  # one cached path: positions 0 .. 14
    sc.state.groups[0].rows[slots[4], 1] += 1  # a wrong position in the FULL K rows
    sweeper.send(WalkSlice(segments=[Segment(slots, 0, -1)]))  # staged after capture: the graph reads it
    graph.replay()
    torch.cuda.synchronize()
    expected = to_device(sc.clone(), "cpu")
    expected.state.ring_count.zero_()
    buf = SweepBuffers(count=sweeper.buffers.count.cpu(), rows=sweeper.buffers.rows.cpu(),
                       counters=torch.zeros(3, dtype=torch.int64))
    sweep_reference.sweep(expected.state, buf)
    assert violations(sc.state) == violations(expected.state)
    assert {(r[1], r[2], r[3]) for r in violations(sc.state)} >= {(0, slots[4], 4)}
    assert sweeper.buffers.counters.tolist() == buf.counters.tolist()
    assert buf.counters.tolist()[:2] == [1, len(slots)]
