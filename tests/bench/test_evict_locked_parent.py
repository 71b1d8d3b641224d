"""``serve.py evict`` reaches ``radix_evict_locked_parent`` on sglang 0.5.17's own radix cache (CPU replay).

The workload's order of events (``evict_plan``) is replayed by ``evict_replay.py`` on the release's
``RadixCache``, ``TokenToKVPoolAllocator``, ``ReqToTokenPool`` and ``alloc_token_slots``, once on the release and
once on a copy with the bug (``bugs.py``): with the bug the node the running request locks is evicted by the new
request's prefill and every one of its slots is handed to that request while the running one still holds the
node; on the release nothing the running request holds is touched. The only eviction in either is that prefill's.
Served on a GPU: not yet (``gpu.sh corpus4``).
"""

from __future__ import annotations

import pytest

from tests.bench.release_with_bug import release_with_bug, replay
from tests.bench.test_sglang_server import HERE, load

BUG = "radix_evict_locked_parent"


def test_the_plan_keeps_every_allocation_before_new_off_the_cache():
    serve = load("serve")
    for pool, chunk in [(4096, 2048), (16384, 8192), (8192, 2048)]:
        plan = serve.evict_plan(pool, chunk)
        held = len(plan["held"])
        fills = sum(map(len, plan["fills"]))
        # held, the child's token, the fills, and what stays free add up to the pool.
        assert held + 1 + fills + plan["left"] == pool
        # held never decodes into the margin, so no fill and no decode step has to evict.
        assert plan["left"] - plan["a_new"] == serve.EVICT_MARGIN
        # new's prefill asks the cache for more than the child and the locked node hold together.
        assert len(plan["new"]) - plan["left"] >= held + serve.EVICT_MARGIN
        assert max(map(len, plan["fills"])) <= serve.EVICT_FILL_MAX and plan["admission_margin"] > 0
        firsts = [p[0] for p in [plan["held"], *plan["fills"], plan["new"]]]
        assert len(set(firsts)) == len(firsts) and plan["child"][:held] == plan["held"]
    with pytest.raises(ValueError, match="twice the chunk"):
        serve.evict_plan(4096, 4096)


def test_gpu_sh_serves_the_bug_with_the_evict_workload():
    text = (HERE / "gpu.sh").read_text()
    corpus4 = text[text.index("    corpus4)"):text.index(";;", text.index("    corpus4)"))]
    assert f"three_ways {BUG} evict" in corpus4 and "radix_insert_frees_new" in corpus4


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return release_with_bug(tmp_path_factory, BUG)


def test_the_release_keeps_the_locked_node_and_the_bug_hands_its_slots_to_new(packages):
    release, buggy, deps = packages
    for parent, bug in [(release, False), (buggy, True)]:
        out = replay("evict_replay.py", parent, deps)
        for case in out["replays"]:
            # The route: one eviction, new's prefill's, asking more than the child and the locked node hold;
            # the running request still holds its node (locked once) and still decodes.
            assert [e["during"] for e in case["evictions"]] == ["new"], case
            assert case["evictions"][0]["asked"] > case["child_len"] + case["locked_len"], case
            assert case["free_before_new"] >= 1 and case["held_running"] and case["locked_lock_ref"] == 1, case
            if bug:  # the locked node left the tree, and every slot of it went to new's prompt
                assert not case["locked_in_tree"], case
                assert case["held_prompt_slots_given_to_new"] == case["held_prompt_slots"] == case["locked_len"]
            else:
                assert case["locked_in_tree"] and case["held_prompt_slots_given_to_new"] == 0, case
