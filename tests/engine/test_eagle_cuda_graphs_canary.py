"""The canary inside EAGLE's CUDA graphs: an engine copy instrumented by the real CLI replays its multi-step
draft chain, target verify and draft-extend from graphs with the canary passes recorded inside them.

Graphs on and off must verify and write exactly the same canary rows (padding rows, req-pool row 0, are
skipped in both), a clean run reports nothing, a fault is reported by the replayed forward that first
reads it (draft chain or verify, told apart by the canary step each replay ran in), and neither the
draft step nor the verify step synchronises with the device.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from canary_instrument.demo import engine_copy, matrix

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine_module(tmp_path_factory):
    pytest.importorskip("libcst")  # the CLI that instruments the copy needs it
    root = tmp_path_factory.mktemp("eagle_graphs") / "engine"
    engine_copy.copy_engine(root)
    engine_copy.instrument(root)
    matrix.quiet_canary_log()
    return engine_copy.import_engine(root)


def build(module, graphs: bool = True, layout: str = "mha", **overrides):
    """(engine, target manager, draft manager) of an instrumented EAGLE engine (log mode, real-KV partial)."""
    # The engines of earlier tests first: collected while this one captures, their CUDA graphs' teardown
    # invalidates the capture (one engine per process, as a server runs, never meets this).
    gc.collect()
    args = dict(matrix.ENGINE_DEFAULTS, attention_layout=layout, speculative_algorithm="EAGLE",
                disable_cuda_graph=not graphs, device="cuda", **overrides)
    engine = module.Engine(**args)
    target, draft = (runner.canary_manager for runner in engine.model_runners)
    assert target is not None and draft is not None
    return engine, target, draft


def graph_runners(engine) -> dict:
    worker = engine.spec_worker
    return {
        "verify": engine.model_runner.graph_runner,
        "draft": worker.cuda_graph_runner,
        "draft_extend": worker.cuda_graph_runner_for_draft_extend,
    }


def replay_steps(runner, manager) -> list[int]:
    """Wrap ``runner.replay`` on the instance; the list gets the canary step of ``manager`` each replay runs in.

    A replay runs inside its site's outside-graph block, which becomes step ``manager.step + 1`` when it ends.
    """
    steps = []
    original = runner.replay

    def replay(forward_batch, *args, **kwargs):
        steps.append(manager.step + 1)
        return original(forward_batch, *args, **kwargs)

    runner.replay = replay
    return steps


def shared_prefix_prompts(seed: int, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 128) for _ in range(20)]
    return [system[: rng.randint(4, 20)] + [rng.randrange(1, 128) for _ in range(rng.randint(1, 24))]
            for _ in range(n)]


@pytest.mark.parametrize("layout", matrix.LAYOUTS)
def test_graphs_and_eager_write_and_verify_the_same_canary_rows(engine_module, layout):
    results = {}
    for graphs in (False, True):
        engine, target, draft = build(engine_module, graphs, layout)
        replays = {name: replay_steps(r, draft if name != "verify" else target)
                   for name, r in graph_runners(engine).items() if graphs}
        outputs = engine.generate(shared_prefix_prompts(layout), 20)
        outputs += engine.generate(shared_prefix_prompts(layout + "2", 5), 12)
        assert target.flush() == [] and draft.flush() == []  # flush raises on a failed health check too
        decode_steps = engine.scheduler.stats.decode_batches
        if graphs:
            assert {name: len(s) for name, s in replays.items()} == dict.fromkeys(replays, decode_steps)
        results[graphs] = dict(
            outputs=outputs,
            stats=[m.stats() for m in (target, draft)],
            # token, position, link; the fingerprint hashes real KV bytes, which batch padding may round differently
            rows=[[g.rows[:, :3].cpu() for g in m.state.groups] for m in (target, draft)],
        )
    eager, graphed = results[False], results[True]
    assert graphed["outputs"] == eager["outputs"]
    assert graphed["stats"] == eager["stats"]
    for eager_rows, graph_rows in zip(eager["rows"], graphed["rows"]):
        for a, b in zip(eager_rows, graph_rows):
            assert torch.equal(a, b)
    target_stats, draft_stats = graphed["stats"]
    assert target_stats.verified > 0 and draft_stats.verified > 0
    # Slot 0 (padding rows write there) never gets a canary row.
    assert all(not row[0].any() for rows in graphed["rows"] for row in rows)


def decoding_engine(module):
    """An engine with three requests decoding through the graphs (three rows: padded to the size-4 graph)."""
    engine, target, draft = build(module)
    rng = random.Random(5)
    reqs = [engine.add_request([rng.randrange(1, 128) for _ in range(n)], 80) for n in (20, 33, 47)]
    for _ in range(20):
        if all(len(r.output_ids) >= 4 for r in reqs):
            break
        engine.step()
    assert all(len(r.output_ids) >= 4 and not r.finished for r in reqs)
    assert target.flush() == [] and draft.flush() == []
    steps = {name: replay_steps(r, draft if name != "verify" else target) for name, r in graph_runners(engine).items()}
    return engine, target, draft, reqs, steps


def _at(found, step):
    return [v for v in found if v.step == step]


def test_remapped_slot_is_caught_by_the_replayed_draft_chain_and_verify(engine_module):
    engine, target, draft, reqs, steps = decoding_engine(engine_module)
    victim, other = reqs[0], reqs[1]
    req_to_token = engine.scheduler.req_to_token_pool.req_to_token
    req_to_token[victim.req_pool_idx, 5] = req_to_token[other.req_pool_idx, 9]
    engine.step()
    draft_found, target_found = draft.flush(), target.flush()
    assert len(steps["draft"]) == len(steps["verify"]) == 1
    for found, step in ((draft_found, steps["draft"][0]), (target_found, steps["verify"][0])):
        hits = [v for v in _at(found, step) if v.req_pool_index == victim.req_pool_idx and v.position == 5]
        assert hits and all("position" in v.reasons for v in hits), found


@pytest.mark.parametrize("which", ["draft", "target"])
def test_flipped_kv_byte_is_caught_by_the_replayed_forward_that_reads_it(engine_module, which):
    engine, target, draft, reqs, steps = decoding_engine(engine_module)
    runner = engine.spec_worker.draft_runner if which == "draft" else engine.model_runner
    victim = reqs[2]
    slot = int(engine.scheduler.req_to_token_pool.req_to_token[victim.req_pool_idx, 7])
    # Byte 3 of layer 0's K row: inside the 16 bytes real-KV `partial` fingerprints.
    runner.token_to_kv_pool.k_buffer[0][slot].reshape(-1).view(torch.uint8)[3] ^= 0x10
    engine.step()
    manager, step = (draft, steps["draft"][0]) if which == "draft" else (target, steps["verify"][0])
    hits = [v for v in _at(manager.flush(), step) if v.slot == slot and v.position == 7]
    assert hits and all(v.reasons == frozenset({"fingerprint"}) for v in hits), hits


def test_swapped_tokens_in_a_replayed_verify_are_caught(engine_module):
    engine, target, draft, reqs, steps = decoding_engine(engine_module)
    swapped = {}

    def swap(forward_batch, runner):
        if swapped or not forward_batch.forward_mode.is_target_verify():
            return
        stride = forward_batch.num_tokens_per_req
        ids = forward_batch.input_ids
        firsts = ids[::stride].tolist()
        i, j = next((i, j) for i in range(len(firsts)) for j in range(i + 1, len(firsts)) if firsts[i] != firsts[j])
        ids[i * stride], ids[j * stride] = firsts[j], firsts[i]
        swapped["rows"] = (i, j)

    remove = engine.hooks.register("batch_built", swap)
    try:
        engine.step()
    finally:
        remove()
    assert swapped and len(steps["verify"]) == 1  # the swapped batch replayed through the verify graph
    # The draft-extend after that verify compares its rows with the target's rows the verify just wrote.
    hits = [v for v in _at(draft.flush(), steps["draft_extend"][0]) if "token" in v.reasons]
    assert hits
    assert {v.req_pool_index for v in hits} <= {reqs[i].req_pool_idx for i in swapped["rows"]}
    assert target.flush() == []


def test_replayed_draft_and_verify_never_synchronise(engine_module):
    """The draft step (batch, canary contexts, replay) and the verify forward make no host-device sync."""
    engine, target, draft, reqs, steps = decoding_engine(engine_module)
    worker, runner = engine.spec_worker, engine.model_runner
    draft_step, forward = worker.draft, runner.forward

    def no_sync(fn):
        def run(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return run

    def checked_forward(forward_batch, *args, **kwargs):
        call = no_sync(forward) if forward_batch.forward_mode.is_target_verify() else forward
        return call(forward_batch, *args, **kwargs)

    worker.draft = no_sync(draft_step)
    runner.forward = checked_forward
    for _ in range(4):
        engine.step()
    assert len(steps["draft"]) == len(steps["verify"]) == 4
    assert target.flush() == [] and draft.flush() == []
