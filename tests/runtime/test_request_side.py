"""The allocator side of the request checks on the reference engine serving on CPU: a KV slot freed while a
request still reads it is reported as ``freed`` at that request's next read, and a runner whose req-pool has
no allocation to wrap runs without the identity check instead of reporting a reused row."""

import logging
import random
from types import SimpleNamespace

import pytest
import torch

from canary_instrument.demo.workload import Workload
from canary_instrument.runtime import install_canary
from canary_instrument.runtime.passes.state import FREED_POSITION

from .mini_engine import MiniRunner
from .refsgl_harness import instrumented


def running_request(harness, rng, min_cached=2, quiet=False):
    """A decoding request with a cached prefix; ``quiet``: one while nothing waits (the next step decodes)."""
    engine = harness.engine
    workload = Workload(engine, rng)
    for _ in range(200):
        workload.step()
        scheduler = engine.scheduler
        reqs = [r for r in scheduler.running if r.cached_len >= min_cached and len(r.output_ids) >= 1
                and r.max_new_tokens - len(r.output_ids) > 3]
        if reqs and not (quiet and (scheduler.waiting or scheduler.chunked_req)):
            return rng.choice(reqs)
    raise AssertionError("no running request with a cached prefix in 200 steps")


@pytest.mark.parametrize("quiet", [True, False], ids=["next_step_decodes", "any_next_step"])
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_slot_freed_while_read_is_reported_at_the_next_read(layout, quiet, caplog):
    """Reported by the first forward of the request after the free: ``freed`` when the row still reads as freed
    at that forward's pass (its mark comes first in the pass), ``position`` once another request's new token
    took the slot in an earlier forward."""
    caplog.set_level(logging.CRITICAL, logger="canary_instrument.runtime")  # restored after the test
    harness = instrumented(layout, max_total_tokens=768, max_context_len=256, chunked_prefill_size=48,
                           sliding_window_size=16)
    rng = random.Random(5)
    req = running_request(harness, rng, quiet=quiet)
    assert harness.manager.flush() == []
    scheduler = harness.engine.scheduler
    position = rng.randrange(req.cached_len)
    slot = int(scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, position])
    reads = []  # whether each forward since the free reads the request
    harness.hooks.before_forward.append(lambda fb: reads.append(req.req_pool_idx in fb.req_pool_indices.tolist()))
    scheduler.allocator.free(torch.tensor([slot], dtype=torch.int64))  # an allocator bug: freed while in use
    while not any(reads):
        harness.engine.step()
    found = [v for v in harness.manager.flush() if (v.req_pool_index, v.position) == (req.req_pool_idx, position)]
    assert found, "the request's next read must report the freed slot"
    full = [v for v in found if v.group == "full"]
    if quiet or len(reads) == 1:  # no forward between the free and the read could have reused the slot
        assert all("freed" in v.reasons and "position" not in v.reasons for v in full)
    else:
        assert all("freed" in v.reasons for v in full) or all("position" in v.reasons for v in full)


def test_req_pool_without_alloc_runs_without_the_identity_check(caplog):
    """The mini engine's req-pool hands out rows without an alloc method: no reset is possible, so no check."""
    with caplog.at_level(logging.WARNING, logger="canary_instrument.runtime"):
        runner = MiniRunner(SimpleNamespace(kv_canary="log"))
    assert runner.canary_manager.state.identity is None
    assert "request-identity check is off" in caplog.text
