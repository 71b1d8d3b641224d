"""The runtime on the reference engine's real pools, scheduler and batches (radix-cache prefix sharing,
chunked prefill, SWA eviction), with the forward site wired the way ``apply`` wires it."""

import os
import random
from pathlib import Path

import pytest

from canary_instrument.demo.engine_copy import import_engine
from canary_instrument.runtime import canary_context, install_canary, mark_init_finished

ENGINE_ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "engine")


@pytest.fixture(scope="module")
def Engine():
    # import_engine replaces a refsgl imported earlier in this worker (e.g. an instrumented copy, which would
    # install its own canary and make the one installed here a second bracket).
    return import_engine(Path(ENGINE_ROOT)).Engine


def _instrumented(Engine, layout):
    engine = Engine(attention_layout=layout, device="cpu", kv_canary="log", kv_canary_real_kv="partial")
    runner = engine.model_runner
    runner.canary_manager = install_canary(server_args=engine.server_args, model_runner=runner)
    original = runner.forward

    def forward(forward_batch, *args, **kwargs):  # the wired ModelRunner.forward site
        manager = None if runner.is_draft_worker else runner.canary_manager
        with canary_context(manager, forward_batch, outside=[0], active=0):
            return original(forward_batch, *args, **kwargs)

    runner.forward = forward
    mark_init_finished(runner.canary_manager)
    return engine, runner.canary_manager


def _prompts(seed, n=8):
    rng = random.Random(seed)
    shared = [rng.randrange(1, 100) for _ in range(32)]
    return [shared[: rng.randrange(4, 32)] + [rng.randrange(1, 100) for _ in range(rng.randrange(1, 20))]
            for _ in range(n)]


@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_clean_serving_reports_nothing(Engine, layout):
    engine, manager = _instrumented(Engine, layout)
    engine.generate(_prompts(layout), max_new_tokens=10)
    assert manager.flush() == []
    stats = manager.stats()
    assert stats.pre_runs == stats.post_runs == stats.steps > 10
    assert stats.tokens_protected > 0


def test_swapped_tokens_in_a_real_decode_batch_are_caught_on_that_step(Engine):
    engine, manager = _instrumented(Engine, "mha")
    seen = {"decodes": 0, "step": None}

    def swap(forward_batch, runner):
        if forward_batch.forward_mode.is_decode() and forward_batch.batch_size >= 2:
            seen["decodes"] += 1
            if seen["decodes"] == 3:
                forward_batch.input_ids[:2] = forward_batch.input_ids[:2].flip(0).clone()
                seen["step"] = manager.step + 1

    engine.hooks.register("batch_built", swap)
    engine.generate(_prompts(1, n=4), max_new_tokens=8)
    found = manager.flush()
    assert seen["step"] is not None and found
    first = min(v.step for v in found)
    assert first == seen["step"]
    assert all("token" in v.reasons for v in found if v.step == first)
