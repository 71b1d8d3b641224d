"""The watch on a flipped cached slot (``perturb/left_cache.py``) on sglang's own ``RadixCache`` and ``TreeNode``:
a split moves the slot to the upper part, eviction under pressure drops the leaf, a request's lock ends the watch
with no line, a flush replaces the root."""

from __future__ import annotations

import importlib
import random
from array import array

import pytest
import torch

from canary_instrument.runtime.features.radix_walk import sample_idle_slot
from canary_instrument.runtime.perturb.left_cache import CacheWatch

KIND = "real_kv_unused_cache"


class FreeingAllocator:
    """What the cache's eviction calls on its allocator: the slots it frees."""

    device = "cpu"

    def __init__(self):
        self.freed: list[int] = []

    def free_segment(self, value, start_pos=0):
        self.freed += value.tolist()

    def free(self, value):
        self.freed += value.tolist()


@pytest.fixture
def radix(sg):
    return (importlib.import_module("sglang.srt.mem_cache.radix_cache"),
            importlib.import_module("sglang.srt.mem_cache.base_prefix_cache"))


def test_the_watch_on_sglang_s_radix_cache(radix):
    rc, base = radix
    allocator = FreeingAllocator()
    cache = rc.RadixCache.create_simulated(mock_allocator=allocator)

    def insert(tokens, slots):
        value = torch.tensor(slots, dtype=torch.int64)
        return cache.insert(base.InsertParams(key=rc.RadixKey(array("q", tokens)), value=value)).last_device_node

    insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(101, 109)))
    slot, position, node, index = sample_idle_slot(cache, random.Random(0))
    assert isinstance(node, rc.TreeNode) and int(node.value[index]) == int(slot.reshape(-1)[0]) == 101 + position
    low, high = CacheWatch(), CacheWatch()
    low.add(cache, KIND, 1, 6, "full", node, 6)  # slot 107
    high.add(cache, KIND, 1, 1, "full", node, 1)  # slot 102
    branch = insert([1, 2, 3, 9], [201, 202, 203, 204])  # splits the node: [1, 2, 3] becomes its new parent
    assert node.value.tolist() == [104, 105, 106, 107, 108] and node.parent.value.tolist() == [101, 102, 103]
    assert low.check(cache, 2) == [] == high.check(cache, 2)

    cache.inc_lock_ref(branch)  # a request on [1, 2, 3, 9] reads slot 102: that watch ends, no line
    assert high.check(cache, 3) == [] and len(high) == 0
    assert cache.evict(base.EvictParams(num_tokens=1)).num_tokens_evicted == 5  # the idle leaf goes
    assert allocator.freed == [104, 105, 106, 107, 108]
    [gone] = low.check(cache, 4)
    assert (gone.step, gone.injected, gone.position, gone.how) == (4, 1, 6, "evicted") and len(low) == 0

    cache.dec_lock_ref(branch)
    upper = branch.parent
    watch = CacheWatch()
    watch.add(cache, KIND, 5, 0, "full", upper, 0)  # slot 101
    assert cache.evict(base.EvictParams(num_tokens=1)).num_tokens_evicted == 1  # the [9] leaf first
    assert watch.check(cache, 6) == []
    cache.evict(base.EvictParams(num_tokens=1))  # then [1, 2, 3], a leaf now
    assert [g.how for g in watch.check(cache, 7)] == ["evicted"]

    leaf = insert([7, 7, 7], [301, 302, 303])
    flushed = CacheWatch()
    flushed.add(cache, KIND, 8, 2, "full", leaf, 2)
    cache.reset()
    assert [g.how for g in flushed.check(cache, 9)] == ["reset"]


def test_the_watch_on_sglang_s_unified_tree(sg):
    # The hybrid SWA models' cache (UnifiedRadixCache): its core walks itself and names no node, but the flip is
    # drawn through its nodes (component_data), so the watch follows a split and tells the eviction, on sglang's
    # own tree core (FULL component alone: the SWA one needs an SWA allocator).
    urc = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
    cip = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    full = importlib.import_module("sglang.srt.mem_cache.unified_cache.components").ComponentType.FULL
    allocator = FreeingAllocator()
    allocator.page_size = 1
    cache = urc.UnifiedRadixCache(cip.CacheInitParams(disable=False, req_to_token_pool=None, page_size=1,
                                                      token_to_kv_pool_allocator=allocator, tree_components=(full,)))

    def insert(tokens, slots):
        cache.insert(base.InsertParams(key=rc.RadixKey(array("q", tokens)), value=torch.tensor(slots, dtype=torch.int64)))

    insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(101, 109)))
    slot, position, node, index = sample_idle_slot(cache, random.Random(0))
    assert type(node).__name__ == "UnifiedTreeNode"
    assert int(node.component_data[0].value[index]) == int(slot.reshape(-1)[0]) == 101 + position
    low, high = CacheWatch(), CacheWatch()
    low.add(cache, KIND, 1, 6, "full", node, 6)  # slot 107
    high.add(cache, KIND, 1, 1, "full", node, 1)  # slot 102
    insert([1, 2, 3, 9], [201, 202, 203, 204])  # splits the node: [1, 2, 3] becomes its new parent
    assert node.component_data[0].value.tolist() == [104, 105, 106, 107, 108]
    assert low.check(cache, 2) == [] == high.check(cache, 2)
    assert cache.evict(base.EvictParams(num_tokens=1)).num_tokens_evicted == 5  # the idle leaf goes
    [gone] = low.check(cache, 3)
    assert (gone.injected, gone.position, gone.how) == (1, 6, "evicted") and high.check(cache, 3) == []
