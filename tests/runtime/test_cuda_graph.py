"""CUDA-graph capture and replay: the canary passes captured before init replay correctly on new batches."""

import time

import pytest
import torch

from canary_instrument.runtime import CanaryHealthError, mark_init_finished
from canary_instrument.runtime.setup import instance_wrap

from .mini_engine import GraphRunner, LogitsModel, MiniRunner, Scheduler, TinyModel, draft_step_batches, server_args

pytestmark = pytest.mark.gpu


def _target(layout="mha", model_cls=TinyModel):
    runner = MiniRunner(server_args(), layout=layout, device="cuda", max_reqs=8, model_cls=model_cls)
    graphs = GraphRunner(runner)
    mark_init_finished(runner.canary_manager)
    return runner, Scheduler(runner), graphs


def _replay_decode(runner, graphs, batch):
    with runner.canary_ctx(batch, outside=[0], active=0):  # the forward site's wiring
        graphs.replay([batch])


POST_PLACES = pytest.mark.parametrize("model_cls", [TinyModel, LogitsModel],
                                      ids=["post-after-model", "post-beside-logits"])


@POST_PLACES
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_replay_with_changing_batches_is_clean_and_counted(layout, model_cls):
    runner, sched, graphs = _target(layout, model_cls)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7, 8]), sched.new_request([9])]
    runner.forward(sched.extend(reqs))
    schedule = [reqs[:2], reqs, reqs[1:2], reqs, reqs[::2]]  # batch sizes 2, 3 (padded to 4), 1, 3, 2
    for i, live in enumerate(schedule):
        _replay_decode(runner, graphs, sched.decode(live, [100 + i] * len(live)))
    manager = runner.canary_manager
    assert manager.flush() == []
    stats = manager.stats()
    assert stats.pre_runs == stats.post_runs == 1 + len(schedule)
    tokens = 9 + sum(len(b) for b in schedule)
    assert stats.tokens_protected == tokens
    assert stats.written == len(manager.state.groups) * tokens
    # The replayed passes wrote real rows at the decoded positions.
    rows = manager.state.groups[0].rows
    assert rows[reqs[1].slots[-1], :2].tolist() == [reqs[1].tokens[-1], len(reqs[1].slots) - 1]


@POST_PLACES
@pytest.mark.parametrize("fault", ["remap", "kv_byte"])
def test_replay_catches_faults(fault, model_cls):
    runner, sched, graphs = _target(model_cls=model_cls)
    reqs = [sched.new_request([1, 2, 3, 4]), sched.new_request([5, 6, 7, 8])]
    runner.forward(sched.extend(reqs))
    _replay_decode(runner, graphs, sched.decode(reqs, [10, 11]))
    batch = sched.decode(reqs, [12, 13])
    if fault == "remap":
        runner.req_to_token_pool.req_to_token[reqs[0].row, 1] = reqs[1].slots[1]
    else:
        runner.token_to_kv_pool.k_buffer[0][reqs[1].slots[2]].view(-1)[1] += 1.0
    _replay_decode(runner, graphs, batch)
    found = runner.canary_manager.flush()
    assert found and {v.step for v in found} == {3}
    if fault == "remap":
        assert all(v.req_pool_index == reqs[0].row for v in found)
        assert any("link" in v.reasons and v.position == 1 for v in found)
    else:
        assert {(v.position, v.half) for v in found} == {(2, "k")}
        assert {v.reasons for v in found} == {frozenset({"fingerprint"})}


def test_graph_captured_without_the_canary_fails_the_health_check():
    # A tagged snapshot every step, so a few steps are enough for the check to come back; each step waits for
    # the device, so the snapshot a step end takes has landed by the next (under load it can lag otherwise).
    runner = MiniRunner(server_args(kv_canary_readback_interval=1), device="cuda", max_reqs=8)
    sched = Scheduler(runner)
    manager = runner.canary_manager
    # A capture site that lost its wiring: the graph holds the model only.
    model_only = instance_wrap.original(runner.model.forward)
    static = sched.extend([sched.new_request([1, 2])])
    model_only(static.input_ids, static.positions, static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model_only(static.input_ids, static.positions, static)
    mark_init_finished(manager)
    with pytest.raises(CanaryHealthError):
        for _ in range(4):
            with runner.canary_ctx(static, outside=[0], active=0):
                graph.replay()
            torch.cuda.synchronize()


def test_multi_step_draft_graph_replays_each_sub_forward():
    args = server_args(speculative_num_steps=3)
    runner = MiniRunner(args, device="cuda", max_reqs=8, is_draft_worker=True)
    graphs = GraphRunner(runner, steps=2)
    manager = runner.canary_manager
    mark_init_finished(manager)
    sched = Scheduler(runner)
    target = [[3, 1, 4, 1, 5], [2, 7, 1, 8]]
    reqs = [sched.new_request(t[1:]) for t in target]
    extend = sched.extend(reqs)
    with manager.with_ops_outside_graph([0], extend), manager.with_active_single_forward_manager(0):
        runner.model.forward(extend.input_ids, extend.positions, extend)
    for round_ in range(3):
        outer, steps = draft_step_batches(sched, reqs, 2, guesses=[[50 + round_, 60 + round_]] * 2)
        with manager.with_ops_outside_graph(range(2), outer):
            graphs.replay(steps)
        for r in reqs:  # drafts rejected: free the two speculative slots
            sched.free_slots += r.slots[-2:]
            r.slots = r.slots[:-2]
    assert manager.flush() == []
    assert manager.stats().pre_runs == 1 + 3 * 2


def test_a_step_never_waits_for_the_main_stream():
    runner, sched, graphs = _target()
    manager = runner.canary_manager
    reqs = [sched.new_request([1, 2, 3])]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [7])
    torch.cuda.synchronize()
    # Queue ~0.1 s of GPU work ahead of the step: a host wait on the main stream would show.
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    _replay_decode(runner, graphs, batch)
    host_seconds = time.perf_counter() - t0
    still_busy = not torch.cuda.current_stream().query()
    assert still_busy, "the GPU finished before the host did: the test measured nothing"
    # The step read the previous step's snapshot, which was ready before the queued work.
    assert host_seconds < 0.05
    assert manager.flush() == []


def test_replayed_decode_checks_the_sampled_tokens():
    runner, sched, graphs = _target()
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7])]
    runner.forward_and_sample(sched.extend(reqs), [20, 30])
    for i in range(3):
        batch = sched.decode(reqs, [20 + i, 30 + i])
        _replay_decode(runner, graphs, batch)
        runner.sample(torch.tensor([21 + i, 31 + i], dtype=torch.int32, device="cuda"), batch)
    assert runner.canary_manager.flush() == []
    batch = sched.decode(reqs, [33, 23])  # each request fed the other's sampled token
    _replay_decode(runner, graphs, batch)
    found = runner.canary_manager.flush()
    assert {(v.req_pool_index, v.position, v.stored, v.expected) for v in found} == {
        (reqs[0].row, 6, 33, 23), (reqs[1].row, 7, 23, 33)}
    assert {v.reasons for v in found} == {frozenset({"token"})}


class _SlowPrePass:
    """The canary's ops with a pre pass that first spins the GPU; each forward's (kind, pre pass stream, post
    pass stream) noted."""

    def __init__(self, ops):
        self._ops, self.forwards, self._pre = ops, [], None
        self.name = ops.name

    def pre_forward(self, state, plan, input_ids):
        self._pre = (plan.extend_const, torch.cuda.current_stream())
        torch.cuda._sleep(2_000_000)  # ~1 ms: longer than the mini model's forward
        self._ops.pre_forward(state, plan, input_ids)

    def post_forward(self, state, plan):
        self.forwards.append((*self._pre, torch.cuda.current_stream()))
        self._ops.post_forward(state, plan)

    def __getattr__(self, name):
        return getattr(self._ops, name)


def _served_with_a_slow_pre_pass(decodes, model_cls=TinyModel):
    """Two requests prefilled, then ``decodes`` replayed decode steps, with the pre pass spinning first (captured
    so in the graphs); the runner, its manager, the slow ops and the requests."""
    runner = MiniRunner(server_args(), device="cuda", max_reqs=8, model_cls=model_cls)
    manager = runner.canary_manager
    manager.ops = slow = _SlowPrePass(manager.ops)
    graphs = GraphRunner(runner)
    mark_init_finished(manager)
    sched = Scheduler(runner)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5])]
    runner.forward(sched.extend(reqs))
    for i in range(decodes):
        _replay_decode(runner, graphs, sched.decode(reqs, [40 + i, 50 + i]))
    return runner, manager, slow, reqs


def test_a_decode_s_pre_pass_runs_beside_its_forward_and_lands_before_the_post_pass():
    runner, manager, slow, reqs = _served_with_a_slow_pre_pass(3)
    # The post pass checked the rows the delayed pre pass wrote: clean, and every new token counted.
    assert manager.flush() == []
    assert manager.stats().tokens_protected == 5 + 3 * 2
    rows = manager.state.groups[0].rows
    assert rows[reqs[0].slots[-1], :2].tolist() == [42, len(reqs[0].slots) - 1]
    # An extend's pre pass is enqueued on its forward's stream (the post pass's); a decode's, eager in warm-up
    # or captured, on another one.
    extends = [pre == post for const, pre, post in slow.forwards if const == 0]
    decodes = [pre != post for const, pre, post in slow.forwards if const > 0]
    assert extends and all(extends)
    assert decodes and all(decodes)


class _SlowForward(LogitsModel):
    spin_cycles = 8_000_000  # ~4 ms before the KV write: a post pass that did not wait for it would run first


def test_a_replayed_decode_s_post_pass_beside_the_logits_follows_every_kv_write():
    runner, manager, slow, _ = _served_with_a_slow_pre_pass(4, model_cls=_SlowForward)
    # Fingerprints taken before the slow forward's KV write would differ from the KV the next passes read.
    assert manager.flush() == []
    assert manager.stats().tokens_protected == 5 + 4 * 2
    # A decode's post pass, captured, was enqueued on the pre pass's stream: beside the logits.
    decodes = [pre == post for const, pre, post in slow.forwards if const > 0]
    assert decodes and all(decodes)
