"""A ``real_kv_unused_cache`` flip whose slot leaves the prefix cache unread: the perturber watches the node the slot
sits in, logs a ``kv_canary_perturb_left_cache=`` line when it is gone, and the scorer counts such a miss as
evicted unread (apart from the misses); a flip read before that still counts as reported."""

import logging
from types import SimpleNamespace

import pytest

from canary_instrument.runtime.perturb import PerturbSettings, score, score_log
from canary_instrument.runtime.perturb.audit import audit
from canary_instrument.runtime.perturb.left_cache import CacheWatch, LeftCache
from canary_instrument.runtime.perturb.perturber import ManagerView, Perturber

from .radix_trees import CompressedRadixCache, UnifiedCache
from .test_perturb_engine import perturbed, serve
from .test_perturb_kinds import scenario
from .test_perturb_score import inj, vio

KIND = "real_kv_unused_cache"


def holder(cache, slot):
    return next(n for n in cache.nodes() if n.value is not None and slot in n.value.tolist())


def evict_subtree(cache, node):
    """Evict ``node`` and everything below it, leaves first (what eviction pressure does to an idle branch)."""
    for child in list(node.children.values()):
        evict_subtree(cache, child)
    return cache.evict_leaf(node)


def test_an_evicted_flip_is_logged_and_scored_as_evicted_unread(canary_log):
    sc = scenario("mha", v_half=False)
    cache = CompressedRadixCache()
    for req in sc.requests:  # finished requests: their positions sit in the cache, unlocked
        cache.insert(req.tokens[: len(req.full_slots)], req.full_slots)
    settings = PerturbSettings(rates=((KIND, 1.0),), seed=0, warmup_steps=0, target_group="full")
    pert = Perturber(settings, sc.state, limit=1)
    pert.at_step_end(ManagerView(step=3, radix_cache=cache))
    [flip] = pert.drain()
    assert flip.applied and flip.req == -1
    pert.at_step_end(ManagerView(step=4, radix_cache=cache))
    assert pert.drain_left() == []  # still cached
    evict_subtree(cache, holder(cache, flip.slot))
    pert.at_step_end(ManagerView(step=5))  # a step end without the cache looks at nothing
    pert.at_step_end(ManagerView(step=6, radix_cache=cache))
    [left] = pert.drain_left()
    assert (left.step, left.kind, left.injected, left.position, left.how) == (6, KIND, 3, flip.position, "evicted")
    pert.at_step_end(ManagerView(step=7, radix_cache=cache))
    assert pert.drain_left() == []  # logged once, then forgotten
    line = next(r.getMessage() for r in canary_log.records if "kv_canary_perturb_left_cache=" in r.getMessage())
    assert LeftCache.parse(line) == left

    # The log scores the miss apart, and the share reported is over what stayed readable.
    log = "\n".join(["WARNING x: " + flip.format(), "WARNING x: " + left.format()])
    result = score_log(log)
    k = result.kinds[KIND]
    assert (k.injected, k.reported, k.missed, k.evicted, k.readable) == (1, 0, [], [flip], 0)
    assert result.evicted == 1 and result.to_dict()["kinds"][KIND]["evicted_unread"] == [flip.format()]
    assert next(r for r in result.format().splitlines() if r.startswith(KIND)).split()[:5] == [KIND, "1", "0", "0", "1"]
    # Without the line (a log from before it existed) it is a plain miss.
    assert score_log(flip.format()).kinds[KIND].missed == [flip]
    # Read (and reported) before it left: reported, whatever the line says.
    read = vio(step=4, slot=flip.slot, position=flip.position, req=-1, group="full", half=flip.half, kernel="sweep")
    log_read = log + "\n" + read.format()
    k = score_log(log_read).kinds[KIND]
    assert (k.reported, k.missed, k.evicted) == (1, [], [])


def test_the_line_names_one_injection_of_its_own_process():
    gone = inj(KIND, step=9, slot=123, position=7, req=-1, group="full", half="k")
    other = inj(KIND, step=12, slot=123, position=7, req=-1, group="full", half="k")
    left = LeftCache(step=20, kind=KIND, injected=9, position=7, how="evicted")
    result = score([gone, other], [], [left])
    assert (result.kinds[KIND].evicted, result.kinds[KIND].missed) == ([gone], [other])
    assert "evicted unread" in result.format()
    log = "\n".join([f"[2026-01-01 00:00:00 TP0] {gone.format()}", f"[2026-01-01 00:00:00 TP1] {gone.format()}",
                     f"[2026-01-01 00:00:00 TP1] {left.format()}"])
    k = score_log(log).kinds[KIND]
    assert (len(k.evicted), len(k.missed)) == (1, 1)  # rank 1's line says nothing of rank 0's flip
    assert LeftCache.parse(left.format()) == left and LeftCache.parse(gone.format()) is None
    with pytest.raises(ValueError, match="malformed kv_canary_perturb_left_cache= line"):
        LeftCache.parse("kv_canary_perturb_left_cache= step=1 kind=x")


def _watch(cache, node, index, group="full", step=1):
    watch = CacheWatch()
    watch.add(cache, KIND, step, 100 + index, group, node, index)
    return watch


def test_the_watch_follows_a_split_and_tells_each_way_a_slot_leaves():
    cache = CompressedRadixCache()
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [101, 102, 103, 104, 105, 106, 107, 108])
    node = holder(cache, 106)
    low, high = _watch(cache, node, 5), _watch(cache, node, 1)  # slots 106 and 102
    cache.insert([1, 2, 3, 9], [201, 202, 203, 204])  # splits the node: [1, 2, 3] above, [4..8] keeps its object
    assert node.value.tolist() == [104, 105, 106, 107, 108]
    assert low.check(cache, 2) == [] and high.check(cache, 2) == []
    assert (high._watched[0].node, high._watched[0].index) == (holder(cache, 102), 1)
    cache.evict_leaf(node)  # the lower part goes; slot 102 stays, in the upper part
    [gone] = low.check(cache, 3)
    assert (gone.step, gone.injected, gone.position, gone.how) == (3, 1, 105, "evicted")
    assert high.check(cache, 3) == [] and len(high) == 1 and len(low) == 0

    # A request holding the node reads the slot: the watch ends with no line (a miss there is a miss).
    upper = holder(cache, 102)
    cache.inc_lock_ref(upper)
    assert high.check(cache, 4) == [] and len(high) == 0

    # HiCache frees the device KV (value None), a flush replaces the root.
    cache.dec_lock_ref(upper)
    device = _watch(cache, upper, 0)
    cache.evict_device(holder(cache, 204))  # leaf first
    assert cache.evict_device(upper) == [101, 102, 103]
    assert [g.how for g in device.check(cache, 5)] == ["freed"]
    cache.insert([5, 6], [301, 302])
    flushed = _watch(cache, holder(cache, 301), 0)
    cache.reset()
    assert [g.how for g in flushed.check(cache, 6)] == ["reset"]


def test_the_watch_is_bounded_and_swa_flips_leave_with_the_swa_slots():
    cache = CompressedRadixCache()
    cache.insert(list(range(40)), list(range(1000, 1040)))
    node = holder(cache, 1000)
    watch = CacheWatch(limit=4)
    for i in range(10):
        watch.add(cache, KIND, i, i, "full", node, i)
    assert len(watch) == 4 and watch.dropped == 6
    swa = _watch(cache, node, 3, group="swa")
    full = _watch(cache, node, 3, group="full")
    node.swa_tombstone = True  # sglang's SWA cache freed the node's SWA slots, the full ones stay
    assert [g.how for g in swa.check(cache, 2)] == ["swa_freed"] and full.check(cache, 2) == []


def unified_holder(cache, slot):
    return next(n for n in cache.tree_core.nodes()
                if n.component_data[0].value is not None and slot in n.component_data[0].value.tolist())


def test_the_watch_follows_sglang_s_unified_tree_the_hybrid_swa_cache():
    # sglang 0.5.17 serves gpt-oss (SWA) from a UnifiedRadixCache: its core walks itself (no node in its rows), but
    # the flip is drawn through its nodes, so the watch follows them: a split, an eviction (value cleared, node
    # detached), the SWA component freed alone (an SWA-group flip only), a request's lock, a flush.
    cache = UnifiedCache()
    core = cache.tree_core
    core.insert([1, 2, 3, 4, 5, 6, 7, 8], [101, 102, 103, 104, 105, 106, 107, 108], [51, 52, 53, 54, 55, 56, 57, 58])
    node = unified_holder(cache, 106)
    low, high = _watch(cache, node, 5), _watch(cache, node, 1)  # slots 106 and 102
    swa, full = _watch(cache, node, 6, group="swa"), _watch(cache, node, 6, group="full")  # slot 107
    core.insert([1, 2, 3, 9], [201, 202, 203, 204])  # splits: [1, 2, 3] above, [4..8] keeps its node object
    assert node.component_data[0].value.tolist() == [104, 105, 106, 107, 108]
    assert all(w.check(cache, 2) == [] for w in (low, high, swa, full))
    assert (high._watched[0].node, high._watched[0].index) == (unified_holder(cache, 102), 1)
    core.free_swa(node)  # the node's SWA slots freed, its full ones kept
    assert [g.how for g in swa.check(cache, 3)] == ["swa_freed"] and full.check(cache, 3) == []
    core.evict_leaf(node)  # value cleared and detached: the lower part goes, slot 102 stays above
    [gone] = low.check(cache, 4)
    assert (gone.step, gone.injected, gone.position, gone.how) == (4, 1, 105, "evicted")
    assert [g.how for g in full.check(cache, 4)] == ["evicted"]
    assert high.check(cache, 4) == [] and len(high) == 1
    upper = unified_holder(cache, 102)
    core.lock(upper)  # a request holds it (its FULL lock): it reads the slot, the watch ends with no line
    assert high.check(cache, 5) == [] and len(high) == 0
    core.lock(upper, -1)
    flushed = _watch(cache, upper, 0)
    core.reset()
    assert [g.how for g in flushed.check(cache, 6)] == ["reset"]


def test_a_cache_flip_in_a_unified_tree_is_watched_until_it_leaves(canary_log):
    sc = scenario("mha", v_half=False)
    cache = UnifiedCache()
    for req in sc.requests:  # finished requests: their positions sit in the cache, unlocked
        cache.tree_core.insert(req.tokens[: len(req.full_slots)], req.full_slots)
    settings = PerturbSettings(rates=((KIND, 1.0),), seed=0, warmup_steps=0, target_group="full")
    pert = Perturber(settings, sc.state, limit=1)
    pert.at_step_end(ManagerView(step=3, radix_cache=cache))
    [flip] = pert.drain()
    assert flip.applied and flip.req == -1
    node = unified_holder(cache, flip.slot)
    for child in list(node.children.values()):
        evict_unified(cache, child)
    cache.tree_core.evict_leaf(node)
    pert.at_step_end(ManagerView(step=4, radix_cache=cache))
    [left] = pert.drain_left()
    assert (left.injected, left.position, left.how) == (3, flip.position, "evicted")


def evict_unified(cache, node):
    for child in list(node.children.values()):
        evict_unified(cache, child)
    cache.tree_core.evict_leaf(node)


def test_on_the_reference_engine_every_flip_said_to_leave_unread_is_overwritten_or_freed(monkeypatch):
    """Served with the sweep off, so cached flips are read only by a request reusing the prefix: the ones the
    watch says left the cache unread are, by the end-of-run audit (which reads the device), rewritten or free."""
    monkeypatch.setattr(logging.getLogger("canary_instrument.runtime"), "disabled", True)
    environ = {"SGLANG_KV_CANARY_PERTURB": f"{KIND}=0.5", "SGLANG_KV_CANARY_PERTURB_SEED": "3",
               "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "5"}
    harness, pert, _ = perturbed("mha", monkeypatch, environ=environ, sweep_interval=10_000)
    serve(harness, 120, seed=4)
    violations = harness.manager.flush()
    result = score(pert.drain(), violations, pert.drain_left())
    k = result.kinds[KIND]
    assert len(k.evicted) >= 3, result.format()
    assert result.unattributed == []
    why = audit(SimpleNamespace(kinds={KIND: SimpleNamespace(missed=k.evicted)}), harness.manager.state,
                harness.tree_cache)
    assert why["undetected"] == [] and len(why["overwritten"]) + len(why["unreachable"]) == len(k.evicted)
