"""The reference engine's hierarchical cache (HiCache): KV evicted to the host pool and loaded back on a prefix
hit reproduces the plain engine's greedy text, and no device or host slot leaks."""

import pytest
import torch

from test_engine import SMALL, generate_two_turns, make, shared_prefix_prompts

# A device pool that holds about three requests: the second turn's prefixes were evicted to the host by then.
TIGHT = dict(max_total_tokens=300, max_running_requests=3)


@pytest.fixture(scope="module")
def plain_outputs(refsgl):
    return {layout: generate_two_turns(make(refsgl, attention_layout=layout, disable_radix_cache=True),
                                       shared_prefix_prompts())
            for layout in ("mha", "mla")}


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_kv_loaded_back_from_the_host_reproduces_recomputation(refsgl, plain_outputs, layout):
    engine = make(refsgl, attention_layout=layout, enable_hierarchical_cache=True, **TIGHT)
    assert generate_two_turns(engine, shared_prefix_prompts()) == plain_outputs[layout]
    cache = engine.scheduler.tree_cache
    assert cache.loaded_back_tokens > 0 and engine.scheduler.stats.evicted_tokens > 0
    # Without the host tier the same run recomputes what HiCache loaded back.
    plain = make(refsgl, attention_layout=layout, **TIGHT)
    generate_two_turns(plain, shared_prefix_prompts())
    assert engine.scheduler.stats.prefix_hit_tokens > plain.scheduler.stats.prefix_hit_tokens


def test_a_host_copy_is_what_the_device_held(refsgl):
    engine = make(refsgl, enable_hierarchical_cache=True, **TIGHT)
    generate_two_turns(engine, shared_prefix_prompts())
    cache = engine.scheduler.tree_cache
    host, device = cache.token_to_kv_pool_host, engine.model_runner.token_to_kv_pool
    both = [n for n in cache._nodes() if not n.evicted and n.host_value is not None]
    assert both
    slots = torch.tensor([n.slot for n in both])
    host_slots = torch.tensor([n.host_value[0] for n in both])
    for layer in range(device.layer_num):
        assert torch.equal(host.k_buffer[layer][host_slots], device.k_buffer[layer][slots])
        assert torch.equal(host.v_buffer[layer][host_slots], device.v_buffer[layer][slots])


@pytest.mark.parametrize("host_ratio", [2.0, 0.3], ids=["roomy", "host-full"])
def test_no_device_or_host_slot_leaks(refsgl, host_ratio):
    engine = make(refsgl, enable_hierarchical_cache=True, hicache_ratio=host_ratio, **TIGHT)
    generate_two_turns(engine, shared_prefix_prompts())
    cache = engine.scheduler.tree_cache
    nodes = list(cache._nodes())
    on_device = [n.slot for n in nodes if not n.evicted]
    on_host = [n.host_value[0] for n in nodes if n.host_value is not None]
    assert len(set(on_device)) == len(on_device) and len(set(on_host)) == len(on_host)
    assert engine.scheduler.allocator.available_size() + len(on_device) == TIGHT["max_total_tokens"]
    assert cache.token_to_kv_pool_host.available_size() + len(on_host) == cache.token_to_kv_pool_host.size
    # A node only the host holds has only host-held nodes below it (eviction runs leaf-first).
    for node in nodes:
        if node.evicted:
            assert all(child.evicted for child in node.children.values())


@pytest.mark.parametrize("args", [dict(attention_layout="swa"), dict(speculative_algorithm="EAGLE")],
                         ids=["swa", "eagle"])
def test_hicache_with_a_second_pool_is_refused(refsgl, args):
    with pytest.raises(ValueError, match="ServerArgs.enable_hierarchical_cache"):
        make(refsgl, enable_hierarchical_cache=True, **args)

