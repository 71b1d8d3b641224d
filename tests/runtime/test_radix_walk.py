"""The sweep's radix-cache walker: which rows it emits, in bounded slices, while the tree changes under it."""

import os
import random
import sys

import pytest
import torch

from canary_instrument.runtime.features.radix_walk import (
    UNKNOWN_PREV,
    FlatRows,
    RadixCursor,
    node_shape,
    sample_idle_slot,
)

from .radix_trees import CompressedRadixCache, FlatWalkCache, UnifiedCache

ENGINE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "golden", "engine"))


def expand(piece) -> list[tuple[int, int, int]]:
    """A slice's rows as host (slot, position, prev_slot) tuples."""
    out = []
    for seg in piece.segments:
        if isinstance(seg, FlatRows):
            out += list(zip(seg.slots.tolist(), seg.positions.tolist(), seg.prevs.tolist()))
            continue
        slots = seg.slots.tolist() if hasattr(seg.slots, "tolist") else list(seg.slots)
        prev = int(seg.prev.reshape(-1)[0]) if hasattr(seg.prev, "shape") else int(seg.prev)
        for j, slot in enumerate(slots):
            out.append((slot, seg.start_position + j, prev if j == 0 else slots[j - 1]))
    return out


def as_rows(truth: dict) -> set:
    return {(slot, pos, prev) for slot, (pos, prev) in truth.items()}


def random_tree(seed: int, requests: int = 12):
    """A compressed tree built like a server fills it: shared prefixes split nodes, a few paths stay locked."""
    rng = random.Random(seed)
    tree = CompressedRadixCache()
    free = list(range(1, 4000))
    rng.shuffle(free)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(3, 12))] for _ in range(3)]
    for _ in range(requests):
        tokens = rng.choice(stems)[: rng.randrange(1, 12)] + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        dup = tree.insert(tokens, [free.pop() for _ in tokens])
        free += dup
    locked = []
    for _ in range(3):
        node = tree.match_prefix(rng.choice(stems)[: rng.randrange(1, 8)])
        tree.inc_lock_ref(node)
        locked.append(node)
    return tree, rng, free, locked


def full_pass(cursor, budget):
    rows, slices = [], 0
    while True:
        piece = cursor.next_slice(budget)
        assert piece.rows <= budget
        rows += expand(piece)
        slices += 1
        if piece.pass_done:
            return rows, slices


@pytest.mark.parametrize("seed", range(5))
def test_one_pass_emits_exactly_the_unlocked_slots(seed):
    tree, *_ = random_tree(seed)
    truth = tree.truth(unlocked_only=True)
    assert truth and len(truth) < len(tree.truth(unlocked_only=False)), "the scenario must lock some nodes"
    rows, _ = full_pass(RadixCursor(tree), budget=10_000)
    assert len(rows) == len(set(rows)) and set(rows) == as_rows(truth)


def test_slices_are_bounded_resume_mid_node_and_count_passes():
    tree, *_ = random_tree(1)
    truth = as_rows(tree.truth())
    cursor = RadixCursor(tree)
    rows, slices = full_pass(cursor, budget=3)
    assert set(rows) == truth and len(rows) == len(truth)
    assert slices >= len(truth) // 3
    assert (cursor.passes, cursor.pass_rows) == (1, 0)
    second, _ = full_pass(cursor, budget=4)
    assert set(second) == truth and cursor.passes == 2


def _apply_random_change(tree, rng, free, locked):
    op = rng.randrange(6)
    nodes = list(tree.nodes())
    if op == 0:
        tokens = [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
        free += tree.insert(tokens, [free.pop() for _ in tokens])
    elif op == 1:  # a partial match splits a node
        node = rng.choice(nodes) if nodes else None
        if node is not None and len(node.key) > 1:
            path = []
            while node is not tree.root_node:
                path = node.key + path
                node = node.parent
            tree.match_prefix(path[: len(path) - rng.randrange(1, 3)])
    elif op == 2:
        leaves = [n for n in nodes if not n.children and n.lock_ref == 0]
        if leaves:
            free += tree.evict_leaf(rng.choice(leaves))
    elif op == 3:
        candidates = [n for n in nodes if n.value is not None and n.lock_ref == 0
                      and all(c.value is None for c in n.children.values())]
        if candidates:
            free += tree.evict_device(rng.choice(candidates))
    elif op == 4 and locked:
        tree.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
    elif op == 5 and nodes:
        node = rng.choice(nodes)
        if node.value is not None:
            tree.inc_lock_ref(node)
            locked.append(node)


@pytest.mark.parametrize("seed", range(8))
def test_rows_stay_true_while_the_tree_changes_between_slices(seed):
    # A stale row would name a slot freed since, or a wrong position or predecessor: a false alarm.
    tree, rng, free, locked = random_tree(seed)
    cursor = RadixCursor(tree)
    emitted = 0
    for _ in range(120):
        truth = tree.truth(unlocked_only=True)
        for slot, pos, prev in expand(cursor.next_slice(rng.randrange(1, 6))):
            assert truth.get(slot) == (pos, prev), (slot, pos, prev, truth.get(slot))
            emitted += 1
        _apply_random_change(tree, rng, free, locked)
        if rng.random() < 0.02:
            tree.reset()  # flush_cache: a new root; requests holding the old tree are gone
            locked.clear()
    assert emitted > 100 and cursor.passes >= 1
    # Left alone, the next full pass covers everything again.
    cursor.next_slice(10_000)  # finish the pass in progress
    rows, _ = full_pass(cursor, budget=7)
    assert set(rows) == as_rows(tree.truth())


def test_device_evicted_nodes_keep_depth_and_hide_the_predecessor():
    tree = CompressedRadixCache()
    tree.insert([1, 2, 3, 4], [11, 12, 13, 14])
    tree.insert([1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16])  # child [5, 6] under [1, 2, 3, 4]
    tree.insert([1, 2, 7], [11, 12, 17])  # splits [1, 2, 3, 4] into [1, 2] -> {[3, 4], [7]}
    middle = tree.root_node.children[1].children[3]
    assert middle.key == [3, 4]
    tree.evict_leaf(middle.children[5])
    tree.insert([1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 25, 26])
    tree.evict_device(middle.children[5])
    tree.evict_device(middle)  # HiCache: [3, 4] and [5, 6] evicted from the device, still in the tree
    # A device-resident node below them (the walker must not rely on leaf-first eviction).
    below = middle.children[5].children[8]
    below.parent, below.key, below.value = middle.children[5], [8], torch.tensor([38])
    rows, _ = full_pass(RadixCursor(tree), budget=100)
    assert sorted(rows) == [(11, 0, UNKNOWN_PREV), (12, 1, 11), (17, 2, 12), (38, 6, UNKNOWN_PREV)]


def test_flat_walk_of_a_tree_core_is_used_and_sliced():
    tree, *_ = random_tree(2)
    cache = FlatWalkCache(tree)
    cursor = RadixCursor(cache)
    rows, slices = full_pass(cursor, budget=5)
    assert set(rows) == as_rows(tree.truth()) and len(rows) == len(tree.truth())
    assert cache.tree_core.calls == slices  # walked afresh per slice: rows from an older walk may be stale


@pytest.fixture(scope="module")
def refsgl_radix_cache():
    sys.path.insert(0, ENGINE_ROOT)
    try:
        from refsgl.srt.mem_cache.radix_cache import RadixCache
    finally:
        sys.path.remove(ENGINE_ROOT)
    return RadixCache


@pytest.mark.parametrize("bigram", [False, True])
def test_reference_engine_tree_one_slot_per_node(refsgl_radix_cache, bigram):
    cache = refsgl_radix_cache(allocator=None, bigram_keys=bigram)
    tokens_a, tokens_b = [5, 6, 7, 8, 9], [5, 6, 1, 2]
    cache.insert(tokens_a, [21, 22, 23, 24][: len(tokens_a) - int(bigram)])
    cache.insert(tokens_b, [21, 22, 31, 32][: len(tokens_b) - int(bigram)])
    _, node = cache.match_prefix(tokens_b + [0])
    cache.inc_lock_ref(node)  # a running request holds [5, 6, 1, (2)]
    rows, _ = full_pass(RadixCursor(cache), budget=2)
    truth = set()
    stack = [(c, 0, UNKNOWN_PREV) for c in cache.root.children.values()]
    while stack:
        n, depth, prev = stack.pop()
        if n.lock_ref == 0:
            truth.add((n.slot, depth, prev))
        stack.extend((c, depth + 1, n.slot) for c in n.children.values())
    assert set(rows) == truth and len(rows) == len(truth)


def test_sample_idle_slot_picks_only_unlocked_slots_at_their_position():
    tree, *_ = random_tree(3)
    truth = tree.truth()
    rng = random.Random(0)
    seen = set()
    for _ in range(2000):
        slot, position, _, _ = sample_idle_slot(tree, rng)
        slot = int(slot.reshape(-1)[0]) if hasattr(slot, "shape") else slot
        assert truth[slot][0] == position
        seen.add(slot)
    assert seen == set(truth)
    slot, position, _, _ = sample_idle_slot(FlatWalkCache(tree), rng)
    assert truth[int(slot[0])][0] == position
    empty = CompressedRadixCache()
    assert sample_idle_slot(empty, rng) is None


def test_caches_without_a_tree_have_nothing_to_walk_and_odd_trees_are_named():
    class ChunkCache:  # sglang's cache when the radix cache is disabled
        pass

    assert node_shape(ChunkCache()) is None and not RadixCursor(ChunkCache()).walkable
    assert RadixCursor(ChunkCache()).next_slice(4).pass_done

    class Node:
        children = {}
        value = None

    class OddCache:
        root_node = Node()

    with pytest.raises(ValueError, match="OddCache.*neither 'full_lock_ref' nor 'lock_ref'"):
        RadixCursor(OddCache())
    with pytest.raises(ValueError, match="budget >= 1"):
        RadixCursor(CompressedRadixCache()).next_slice(0)


def test_swa_trees_lock_with_full_lock_ref():
    # sglang's SWARadixCache counts running requests in full_lock_ref (swa_lock_ref covers the window only).
    tree = CompressedRadixCache()
    tree.insert([1, 2, 3], [11, 12, 13])
    tree.insert([1, 2, 4], [11, 12, 14])
    for node in [tree.root_node, *tree.nodes()]:
        node.full_lock_ref, node.lock_ref = node.lock_ref, 99
    tree.root_node.children[1].children[3].full_lock_ref = 1
    assert node_shape(tree).lock_attr == "full_lock_ref"
    rows, _ = full_pass(RadixCursor(tree), budget=8)
    assert sorted(rows) == [(11, 0, UNKNOWN_PREV), (12, 1, 11), (14, 2, 12)]


def random_unified(seed: int):
    """sglang 0.5.17's unified tree filled like random_tree: shared stems split nodes, a few paths locked (FULL)."""
    rng = random.Random(seed)
    cache = UnifiedCache()
    core = cache.tree_core
    slots = iter(range(1, 4000))
    stems = [[rng.randrange(50) for _ in range(rng.randrange(3, 12))] for _ in range(3)]
    for _ in range(12):
        tokens = rng.choice(stems)[: rng.randrange(1, 12)] + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        core.insert(tokens, [next(slots) for _ in tokens])  # duplicates keep the cached slots, as sglang's
    for node in rng.sample(list(core.nodes()), 3):
        core.lock(node)
    return cache


def test_a_unified_tree_is_sampled_through_its_nodes_and_swept_by_its_own_walk():
    # sglang 0.5.17's hybrid SWA cache: the core walks itself (rows, no node), but its nodes are host objects, so
    # a cache flip is drawn through them and names its node; the sweep keeps the core's walk.
    cache = random_unified(4)
    flat = cache.tree_core.walk_for_kv_canary(unlocked_only=True, swa_resident_only=False)
    truth = {s: p for s, p in zip(flat.slot_indices.tolist(), flat.positions.tolist())}
    assert node_shape(cache).slots_attr == "component_data"
    rng = random.Random(0)
    seen = set()
    for _ in range(3000):
        slot, position, node, index = sample_idle_slot(cache, rng)
        slot = int(slot.reshape(-1)[0])
        assert truth[slot] == position and node.component_data[0].lock_ref == 0
        assert int(node.component_data[0].value[index]) == slot
        seen.add(slot)
    assert seen == set(truth)
    rows, _ = full_pass(RadixCursor(cache), budget=7)
    assert set(rows) == set(zip(flat.slot_indices.tolist(), flat.positions.tolist(), flat.prev_slot_indices.tolist()))
