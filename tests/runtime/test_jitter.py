"""Timing jitter: settings, the seeded draw, the kernel against its spec, the points it runs at on the
reference engine, nothing installed or called when off, and fresh draws on every CUDA-graph replay."""

import pytest
import torch

from canary_instrument.runtime.features import jitter as jitter_module
from canary_instrument.runtime.features.jitter import (
    COUNT,
    LAST,
    NUM_POINTS,
    POINT_ID,
    TOTAL,
    Jitter,
    JitteredOps,
    draw_ns,
    runner_seed,
)
from canary_instrument.runtime.setup.settings import JITTER_POINTS, load_settings

from .refsgl_harness import instrumented

LAYERS = 2  # the reference engine's default num_hidden_layers


# ------------------------------------------------------------------ settings


def test_jitter_is_off_by_default_and_every_point_is_chosen():
    settings = load_settings(None, {"KV_CANARY": "log"})
    assert settings.jitter_max_us == 0 and settings.jitter_seed == 0
    assert settings.jitter_points == JITTER_POINTS


def test_jitter_settings_from_upstream_style_variables_and_server_args():
    env = {"SGLANG_KV_CANARY_JITTER_MAX_US": "250", "SGLANG_KV_CANARY_JITTER_SEED": str(2**40 + 3),
           "SGLANG_KV_CANARY_JITTER_POINTS": " post_after, ATTN_BEFORE ,pre_before"}
    settings = load_settings(None, env)
    assert (settings.jitter_max_us, settings.jitter_seed) == (250, 2**40 + 3)
    assert settings.jitter_points == ("pre_before", "attn_before", "post_after")  # forward order

    class Args:
        kv_canary_jitter_max_us = 7
        kv_canary_jitter_points = "all"

    settings = load_settings(Args(), env)
    assert settings.jitter_max_us == 7 and settings.jitter_points == JITTER_POINTS


@pytest.mark.parametrize("var, value", [
    ("SGLANG_KV_CANARY_JITTER_MAX_US", "-1"),
    ("SGLANG_KV_CANARY_JITTER_MAX_US", "1.5"),
    ("SGLANG_KV_CANARY_JITTER_MAX_US", "10000001"),
    ("SGLANG_KV_CANARY_JITTER_SEED", str(2**63)),
    ("SGLANG_KV_CANARY_JITTER_POINTS", "pre_before,attention"),
    ("SGLANG_KV_CANARY_JITTER_POINTS", ","),
])
def test_bad_jitter_setting_names_the_variable(var, value):
    with pytest.raises(ValueError, match=var):
        load_settings(None, {var: value})


# ------------------------------------------------------------------ the draw


def test_draws_are_uniform_over_zero_to_max():
    max_ns, n, bins = 999, 40_000, 10
    draws = [draw_ns(7, c, p, max_ns) for p in range(NUM_POINTS) for c in range(n // NUM_POINTS)]
    assert min(draws) == 0 or min(draws) < max_ns // 100
    assert max(draws) <= max_ns and min(draws) >= 0
    counts = [0] * bins
    for d in draws:
        counts[d * bins // (max_ns + 1)] += 1
    expected = len(draws) / bins
    sigma = (expected * (1 - 1 / bins)) ** 0.5  # binomial spread of one bin
    assert all(abs(c - expected) < 5 * sigma for c in counts), counts


def test_seed_and_point_give_their_own_sequences_and_a_seed_repeats_its_own():
    def sequence(seed, point):
        return [draw_ns(seed, c, point, 10**6) for c in range(32)]

    assert sequence(1, 0) == sequence(1, 0)
    assert sequence(1, 0) != sequence(2, 0)
    assert sequence(1, 0) != sequence(1, 1)
    assert runner_seed(5, is_draft=False) == 5
    assert sequence(runner_seed(5, is_draft=True), 0) != sequence(5, 0)
    assert draw_ns(9, 3, 2, 0) == 0  # max 0: never waits


@pytest.mark.parametrize("seed", [0, 12345, 2**40 + 17, 2**63 - 1])
def test_kernel_draws_and_counts_exactly_as_the_spec_and_the_host_backend(seed):
    """The Triton kernel (interpreted on CPU, compiled on a GPU) against ``draw_ns`` and the host twin."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    enabled = torch.ones(1, dtype=torch.int32, device=device)
    kernel = Jitter(seed=seed, max_us=2, enabled=enabled, backend="triton")
    host = Jitter(seed=seed, max_us=2, enabled=torch.ones(1, dtype=torch.int32), backend="host")
    launches = [0, 2, 5, 5, 1, 2, 5]
    for point in launches:
        kernel.wait(point)
        host.wait(point)
    assert kernel.state.cpu().tolist() == host.state.tolist()
    for point in range(NUM_POINTS):
        n = launches.count(point)
        draws = [draw_ns(seed, c, point, 2000) for c in range(n)]
        assert kernel.state[COUNT, point].item() == n
        assert kernel.state[TOTAL, point].item() == sum(draws)
        assert kernel.state[LAST, point].item() == (draws[-1] if draws else 0)


@pytest.mark.parametrize("backend", ["triton", "host"])
def test_nothing_is_drawn_before_init_finished(backend):
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    enabled = torch.zeros(1, dtype=torch.int32, device=device)
    j = Jitter(seed=1, max_us=5, enabled=enabled, backend=backend)
    j.wait(0)
    assert j.state.abs().sum().item() == 0
    enabled.fill_(1)
    j.wait(0)
    assert j.counts()["pre_before"] == 1 and j.state[LAST, 0].item() == draw_ns(1, 0, 0, 5000)


# ------------------------------------------------------------------ on the reference engine (CPU: host sleeps)


def _prompts():
    return [[(7 * i + j) % 100 + 1 for j in range(12 + i)] for i in range(4)]


def test_off_installs_nothing_and_never_calls_a_jitter_point(monkeypatch):
    calls = []
    original_wait = Jitter.wait
    monkeypatch.setattr(Jitter, "wait", lambda self, point: calls.append(point) or original_wait(self, point))
    h = instrumented("mha")
    manager = h.manager
    assert manager.jitter is None
    assert not isinstance(manager.ops, JitteredOps)
    assert "set_kv_buffer" not in vars(h.engine.model_runner.token_to_kv_pool)  # the pool's own method
    h.engine.generate(_prompts(), max_new_tokens=6)
    assert manager.flush() == [] and manager.stats().pre_runs >= 6
    assert calls == []

    # The same run with jitter on does call them: the count above could have failed.
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "1")
    h = instrumented("mha")
    h.engine.generate(_prompts(), max_new_tokens=6)
    assert len(calls) >= 6


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_every_point_runs_once_per_canary_pass_or_layer_and_repeats_with_its_seed(layout, monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "20")
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_SEED", "1234")

    def run():
        h = instrumented(layout)
        h.engine.generate(_prompts(), max_new_tokens=5)
        assert h.manager.flush() == []  # waiting perturbs timing only: a clean engine stays clean
        return h.manager

    manager = run()
    jitter = manager.jitter
    assert jitter.backend == "host" and isinstance(manager.ops, JitteredOps)
    forwards = manager.stats().pre_runs
    counts = jitter.counts()
    assert counts == {"pre_before": forwards, "pre_after": forwards, "post_before": forwards,
                      "post_after": forwards, "attn_before": LAYERS * forwards, "attn_after": LAYERS * forwards}
    for name, point in POINT_ID.items():
        draws = [draw_ns(1234, c, point, 20_000) for c in range(counts[name])]
        assert jitter.state[TOTAL, point].item() == sum(draws)
    assert torch.equal(run().jitter.state, jitter.state)


def test_points_setting_limits_where_it_waits(monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "5")
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_POINTS", "attn_before")
    h = instrumented("mha")
    assert not isinstance(h.manager.ops, JitteredOps)  # no pass point chosen: the ops stay the backend's own
    h.engine.generate(_prompts(), max_new_tokens=3)
    assert h.manager.flush() == []
    counts = h.manager.jitter.counts()
    assert counts["attn_before"] == LAYERS * h.manager.stats().pre_runs > 0
    assert sum(counts.values()) == counts["attn_before"]


def test_kv_write_wrapper_refuses_to_stack(monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "5")
    h = instrumented("mha")
    with pytest.raises(ValueError, match="already has jitter points"):
        jitter_module.wrap_kv_write(h.engine.model_runner.token_to_kv_pool, h.manager.jitter, JITTER_POINTS)


# ------------------------------------------------------------------ GPU: graphs and launches


@pytest.mark.gpu
def test_captured_waits_draw_fresh_lengths_on_every_replay_and_take_that_long():
    enabled = torch.ones(1, dtype=torch.int32, device="cuda")
    j = Jitter(seed=99, max_us=200, enabled=enabled, backend="triton")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        j.wait(1)  # compile outside the capture
    torch.cuda.synchronize()
    j.state.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        j.wait(1)
        j.wait(4)
    j.state.zero_()  # capture does not run the kernels; the counters start at zero anyway
    lasts, elapsed = [], []
    for _ in range(8):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        lasts.append(j.state[LAST, 1].item())
        elapsed.append((start.elapsed_time(end) * 1e6, j.state[LAST, 1].item() + j.state[LAST, 4].item()))
    assert lasts == [draw_ns(99, c, 1, 200_000) for c in range(8)]
    assert len(set(lasts)) == 8
    assert j.counts()["pre_after"] == j.counts()["post_before"] == 8
    # Slack for the two clocks: %globaltimer ticks in steps of up to a microsecond, events resolve ~0.5 us.
    assert all(took_ns >= drawn_ns - 2 * 1000 for took_ns, drawn_ns in elapsed), elapsed


def _jitter_kernels(run) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if "jitter_wait" in e.key)


@pytest.mark.gpu
def test_off_launches_no_jitter_kernel_on_the_gpu_and_on_launches_one_per_point(monkeypatch):
    h = instrumented("mha", device="cuda")
    h.engine.generate(_prompts(), max_new_tokens=2)  # compile outside the profile
    assert _jitter_kernels(lambda: h.engine.generate(_prompts(), max_new_tokens=4)) == 0

    monkeypatch.setenv("SGLANG_KV_CANARY_JITTER_MAX_US", "1")
    h = instrumented("mha", device="cuda")
    h.engine.generate(_prompts(), max_new_tokens=2)
    h.manager.flush()
    before = h.manager.stats().pre_runs
    launched = _jitter_kernels(lambda: h.engine.generate(_prompts(), max_new_tokens=4))
    h.manager.flush()
    forwards = h.manager.stats().pre_runs - before
    assert launched == (4 + 2 * LAYERS) * forwards > 0
