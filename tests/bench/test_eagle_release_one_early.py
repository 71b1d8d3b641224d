"""``eagle_release_one_early`` (issue 36's corpus, EAGLE free) on sglang 0.5.17, on the CPU.

The edit (``bugs.py``) makes ``_release_overallocated_kv_indices`` (``mem_cache/common.py``) free an EAGLE request's
over-allocated verify window from one position early, its last committed one. ``eagle_free_replay.py`` replays a
request's prefill, three verifies and its release (finish, and retract) on the release's ``RadixCache`` with
EAGLE's bigram keys, ``TokenToKVPoolAllocator``, ``ReqToTokenPool``, ``alloc_token_slots`` and
``release_kv_cache``, once on the release and once on a copy with the bug: with the bug the last committed slot,
which ``cache_finished_req`` has already freed (the bigram key leaves it out of the tree), is on the free list
twice, sglang's own accounting (what its idle leak check compares) comes to one more than the pool, and two
later prefills both receive the slot; on the release nothing is freed twice. A request without speculation
(no over-allocated tail) is untouched either way. Served on a GPU: not yet (``gpu.sh corpus3``).
"""

from __future__ import annotations

import pytest

from tests.bench.release_with_bug import release_with_bug, replay
from tests.bench.test_sglang_server import HERE, bundle, load, lock_release

BUG = "eagle_release_one_early"


def test_the_bug_is_one_edit_of_the_over_allocation_release(tmp_path):
    """bugs.py applies the edit to the cached 0.5.17 package; the edited text is the slice of the over-allocated
    release alone, inside its ``start_p < end_p`` branch (a request with no tail never reaches it), with the
    non-speculative assert, the page alignment and the free call as they were."""
    from tests.realtree.conftest import sglang_srt

    bugs = load("bugs")
    bug = bugs.BUGS[BUG]
    package = sglang_srt(lock_release(bundle.lock_file("0.5.17"))).parent
    source = (package / "srt" / bug.path).read_text()
    assert source.count(bug.old) == 1
    dest = tmp_path / "sglang"
    (dest / "srt" / bug.path).parent.mkdir(parents=True)
    (dest / "srt" / bug.path).write_text(source)
    bugs.apply(dest, BUG)
    edited = (dest / "srt" / bug.path).read_text()
    compile(edited, bug.path, "exec")
    assert edited == source.replace("            start_p:end_p\n", "            start_p - 1 : end_p\n")
    release = edited[edited.index("def _release_overallocated_kv_indices("):edited.index("def available_and_evictable_str(")]
    branch = release[release.index("    if start_p < end_p:\n"):]
    assert "[\n            start_p - 1 : end_p\n        ]\n" in branch
    assert "allocator.free_segment(indices_to_free, start_pos=start_p)" in branch
    assert "            start_p == end_p\n" in release and "start_p = ceil_align(start_p, page_size)" in release
    # The path it breaks: release_kv_cache hands it the committed length as the start.
    assert "    start_p, end_p = effective_kv_committed_len, req.kv.kv_allocated_len\n" in edited


def test_gpu_sh_serves_the_bug_three_ways_on_eagle_with_a_small_pool():
    text = (HERE / "gpu.sh").read_text()
    corpus3 = text[text.index("    corpus3)"):text.index(";;", text.index("    corpus3)"))]
    assert f"{BUG}:eagle-4096" in corpus3 and "eagle_accept_one_more:eagle" in corpus3
    assert '[ "$layout" = eagle-4096 ] && { layout=eagle; extra=(--pool-tokens 4096); }' in corpus3
    assert 'three_ways "$bug" correctness --layout "$layout"' in corpus3
    assert BUG in load("report").BUG_NAMES


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return release_with_bug(tmp_path_factory, BUG)


def test_the_release_frees_the_last_committed_slot_once_and_the_bug_hands_it_to_two_requests(packages):
    release, buggy, deps = packages
    for parent, bug in [(release, False), (buggy, True)]:
        cases = replay("eagle_free_replay.py", parent, deps)["cases"]
        assert [(c["eagle"], c["is_insert"]) for c in cases] == [(True, True), (True, False), (False, True)]
        for case in cases:
            slot = case["last_committed_slot"]
            if not case["eagle"]:  # no over-allocated tail: nothing freed past the committed length, either way
                assert case["committed"] == case["allocated"] and case["freed"] == [], case
                assert case["accounted_after_release"] == case["pool"] and not case["slots_of_two_requests"], case
                continue
            # Three verifies left a window past the committed tokens; the release frees it with the last
            # committed slot (cache_finished_req's bigram tail), in this order on the free list.
            assert case["allocated"] > case["committed"], case
            if bug:
                assert case["times_on_free_list"] == 2 and case["freed"].count(slot) == 2, case
                assert case["accounted_after_release"] == case["pool"] + 1, case  # sglang's idle check: a leak
                # Two later prefills each hold it: the first at its last position, the second at its first.
                assert case["slots_of_two_requests"] == [slot], case
                assert case["c_positions_of_shared"] == [0] and len(case["b_positions_of_shared"]) == 1, case
            else:
                assert case["times_on_free_list"] == 1 and case["freed"].count(slot) == 1, case
                assert case["accounted_after_release"] == case["pool"], case
                assert case["slots_of_two_requests"] == [], case
