"""The pristine reference engine generates correctly: every cache path gives the same greedy text.

Greedy decoding is deterministic, so chunked prefill, prefix sharing, eviction, mixed
batches and EAGLE (lossless under greedy acceptance) must all reproduce the plain
engine's tokens; any KV that is written to or read from the wrong slot changes them.
"""

import random

import pytest
import torch

LAYOUTS = ("mha", "mla", "swa")
SMALL = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_running_requests=8, max_context_len=256, max_total_tokens=2048,
    chunked_prefill_size=512, sliding_window_size=12,
)


def make(refsgl, **overrides):
    return refsgl.Engine(**dict(SMALL, **overrides))


def shared_prefix_prompts(seed=0, n=10):
    rng = random.Random(seed)
    systems = [[rng.randrange(128) for _ in range(rng.randint(10, 30))] for _ in range(2)]
    return [rng.choice(systems) + [rng.randrange(128) for _ in range(rng.randint(2, 40))] for _ in range(n)]


def generate_two_turns(engine, prompts, max_new_tokens=16):
    """Two rounds: the second round's prompts extend the first round's conversations (prefix hits)."""
    first = engine.generate(prompts, max_new_tokens)
    follow_ups = [p + out + [7, 8, 9] for p, out in zip(prompts, first)]
    return first + engine.generate(follow_ups, max_new_tokens)


@pytest.fixture(scope="module")
def reference_outputs(refsgl):
    """Plain engine: no prefix cache, whole-prompt prefill, no speculation."""
    return {
        layout: generate_two_turns(make(refsgl, attention_layout=layout, disable_radix_cache=True),
                                   shared_prefix_prompts())
        for layout in LAYOUTS
    }


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefix_cache_reproduces_recomputation(refsgl, reference_outputs, layout):
    engine = make(refsgl, attention_layout=layout)
    assert generate_two_turns(engine, shared_prefix_prompts()) == reference_outputs[layout]
    assert engine.scheduler.stats.prefix_hit_tokens > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunked_prefill_reproduces_whole_prefill(refsgl, reference_outputs, layout):
    engine = make(refsgl, attention_layout=layout, chunked_prefill_size=7)
    assert generate_two_turns(engine, shared_prefix_prompts()) == reference_outputs[layout]
    assert engine.scheduler.stats.chunked_prefills > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_batches_reproduce_separate_batches(refsgl, reference_outputs, layout):
    engine = make(refsgl, attention_layout=layout, enable_mixed_chunk=True, chunked_prefill_size=16,
                  max_running_requests=4)
    assert generate_two_turns(engine, shared_prefix_prompts()) == reference_outputs[layout]
    assert engine.scheduler.stats.mixed_batches > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eagle_is_lossless_and_accepts_some_drafts(refsgl, reference_outputs, layout):
    engine = make(refsgl, attention_layout=layout, speculative_algorithm="EAGLE", chunked_prefill_size=20)
    outputs = generate_two_turns(engine, shared_prefix_prompts())
    assert outputs == reference_outputs[layout]
    stats = engine.scheduler.stats
    assert 0 < stats.accepted_drafts < stats.proposed_drafts
    assert stats.prefix_hit_tokens > 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "eagle"])
def test_memory_pressure_evicts_cache_and_keeps_outputs(refsgl, reference_outputs, layout, eagle):
    engine = make(refsgl, attention_layout=layout, max_total_tokens=300, max_running_requests=3,
                  speculative_algorithm="EAGLE" if eagle else None)
    outputs = generate_two_turns(engine, shared_prefix_prompts())
    assert outputs == reference_outputs[layout]
    assert engine.scheduler.stats.evicted_tokens > 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "eagle"])
def test_no_slot_leaks_after_all_requests_finish(refsgl, layout, eagle):
    engine = make(refsgl, attention_layout=layout, speculative_algorithm="EAGLE" if eagle else None)
    generate_two_turns(engine, shared_prefix_prompts())
    scheduler = engine.scheduler
    # Every slot is either free or owned by exactly one prefix-cache node.
    cached = [node.slot for node in scheduler.tree_cache._nodes()]
    assert len(set(cached)) == len(cached)
    free = scheduler.allocator.available_size() if layout != "swa" else scheduler.allocator.full_available_size()
    assert free + len(cached) == SMALL["max_total_tokens"]
    assert scheduler.req_to_token_pool.available_size() == scheduler.req_to_token_pool.size
    if layout == "swa":
        mapping = scheduler.allocator.full_to_swa_index_mapping
        held = [node.slot for node in scheduler.tree_cache._nodes() if node.swa_held]
        mapped = torch.nonzero(mapping).flatten().tolist()
        # Idle engine: only the cache's window holds keep SWA slots, each a distinct one.
        assert sorted(mapped) == sorted(held)
        assert len(set(mapping[mapped].tolist())) == len(mapped)
        assert scheduler.allocator.swa_available_size() + len(mapped) == SMALL["max_total_tokens"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eagle_windows_keep_their_slots_between_steps(refsgl, layout):
    """As sglang's spec v2: a decode step frees no KV slot; a request's next window writes the slots its
    rejected drafts had, and allocates only the positions past its last window."""
    engine = make(refsgl, attention_layout=layout, speculative_algorithm="EAGLE")
    scheduler = engine.scheduler
    table = scheduler.req_to_token_pool.req_to_token
    frees = []
    free = scheduler.allocator.free
    scheduler.allocator.free = lambda index, *a, **k: (frees.append(index.numel()), free(index, *a, **k))[1]
    for prompt in shared_prefix_prompts(n=4):
        engine.add_request(prompt, 40)
    window = scheduler.num_draft_tokens
    kept = 0
    while not scheduler.is_idle():
        before = {r.rid: (r.cached_len, r.kv_allocated_len, table[r.req_pool_idx].clone()) for r in scheduler.running}
        frees.clear()
        batch = engine.step()
        if not batch.forward_mode.is_decode():
            continue
        if not any(r.finished for r in batch.reqs):
            assert frees == []
        for r in batch.reqs:
            cached, allocated, row = before[r.rid]
            assert r.kv_allocated_len == max(allocated, cached + window)
            # The slots of the window's positions the last window had allocated are the same slots.
            same = slice(cached, min(allocated, cached + window))
            assert torch.equal(table[r.req_pool_idx, same], row[same]) or r.finished
            kept += max(0, same.stop - same.start)
    assert kept > 0 and 0 < scheduler.stats.accepted_drafts < scheduler.stats.proposed_drafts


def test_swa_slots_leave_with_the_window(refsgl):
    engine = make(refsgl, attention_layout="swa", sliding_window_size=8)
    req = engine.add_request(list(range(40)), 30)
    scheduler = engine.scheduler
    for _ in range(20):
        engine.step()
        if req.finished:
            break
        slots = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, : req.cached_len].long()
        mapped = scheduler.allocator.full_to_swa_index_mapping[slots] > 0
        window_start = req.cached_len - 8
        assert mapped[window_start:].all()
        assert not mapped[:window_start].any()
    assert scheduler.stats.swa_released_tokens > 0


def test_allocator_never_hands_out_padding_slot_and_reuses_freed_first(refsgl):
    engine = make(refsgl, max_total_tokens=64)
    allocator = engine.scheduler.allocator
    slots = allocator.alloc(64)
    assert 0 not in slots.tolist() and sorted(slots.tolist()) == list(range(1, 65))
    assert allocator.alloc(1) is None
    allocator.free(slots[10:12])
    assert allocator.alloc(2).tolist() == slots[10:12].tolist()


def test_attention_reads_kv_through_req_to_token(refsgl, reference_outputs):
    """Moving a request's KV to other slots and repointing req_to_token changes nothing."""
    engine = make(refsgl, attention_layout="mha", disable_radix_cache=True)
    prompts = shared_prefix_prompts()
    req = engine.add_request(prompts[0], 16)
    engine.step()  # prefill
    pool = engine.model_runner.token_to_kv_pool
    row = engine.scheduler.req_to_token_pool.req_to_token[req.req_pool_idx]
    old = row[: req.cached_len].long()
    new = engine.scheduler.alloc_token_slots(req.cached_len)
    for layer in range(len(pool.k_buffer)):
        pool.k_buffer[layer][new] = pool.k_buffer[layer][old]
        pool.v_buffer[layer][new] = pool.v_buffer[layer][old]
        pool.k_buffer[layer][old] = 0
        pool.v_buffer[layer][old] = 0
    row[: req.cached_len] = new.to(torch.int32)
    while not req.finished:
        engine.step()
    assert req.output_ids == reference_outputs["mha"][0]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("attention_layout", "gqa", "ServerArgs.attention_layout"),
        ("kv_canary", "on", "ServerArgs.kv_canary"),
        ("kv_canary_real_kv", "some", "ServerArgs.kv_canary_real_kv"),
        ("speculative_algorithm", "MEDUSA", "ServerArgs.speculative_algorithm"),
        ("max_total_tokens", 0, "ServerArgs.max_total_tokens"),
    ],
)
def test_bad_server_args_name_the_field(refsgl, field, value, message):
    with pytest.raises(ValueError, match=message):
        make(refsgl, **{field: value})


def test_request_that_cannot_fit_is_refused(refsgl):
    engine = make(refsgl, max_context_len=64)
    with pytest.raises(ValueError, match="max_context_len=64"):
        engine.add_request(list(range(60)), 10)
