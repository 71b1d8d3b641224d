"""Replay an EAGLE request's life and release on sglang's own radix cache and token allocator, on the CPU.

    python tests/bench/eagle_free_replay.py PACKAGE_PARENT DEPS

PACKAGE_PARENT holds an ``sglang`` package (the release, or a copy with ``eagle_release_one_early`` of
``bugs.py`` in it), DEPS the packages its memory-cache modules import (``tests/runtime/real_sglang/sglang_site.py``).
Run as its own process: the real-class tests import another sglang release into theirs. Prints one JSON object.

What is sglang's and what is modelled. sglang's: ``RadixCache`` with EAGLE's bigram keys (``is_eagle``:
``cache_unfinished_req``, ``cache_finished_req``), ``TokenToKVPoolAllocator`` (page 1, unsorted: the server's
default), ``ReqToTokenPool``, ``alloc_token_slots``, and ``release_kv_cache`` (``mem_cache/common.py``: the
finish path's and, with ``is_insert=False``, the retract path's release, with its over-allocation release).
Modelled, as spec v2 does them: the prefill (the prompt's slots, ``kv_committed_len`` the prompt, one output
token), ``eagle_prepare_for_decode``'s window (``kv_allocated_len`` raised to the committed length plus
``get_alloc_reserve_per_decode``: 2 x 4 for 3 steps, top-k 1, 4 draft tokens) and each verify's commit
(``kv_committed_len`` += the accepted run, drafts and bonus); ``get_spec`` and ``get_serving`` answer EAGLE and
no thinking-strip. Then two requests' prefills take the free list in order, as any later allocation does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from replay_req import Req  # beside this script (its folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]
RESERVE = 2 * 4  # get_alloc_reserve_per_decode: 2 * max(num_steps * topk, num_draft_tokens)
POOL = 96


class Scheduler:
    def __init__(self, eagle: bool):
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache

        self.eagle = eagle
        self.allocator = TokenToKVPoolAllocator(POOL, torch.float16, "cpu", kvcache=None, need_sort=False)
        self.rows = ReqToTokenPool(size=8, max_context_len=POOL + 16, device="cpu", enable_memory_saver=False)
        self.cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.rows,
                                                token_to_kv_pool_allocator=self.allocator, page_size=1,
                                                is_eagle=eagle))
        self.next_row = 1

    def write(self, req: Req, start: int, slots) -> None:
        import torch

        self.rows.write((req.req_pool_idx, slice(start, start + len(slots))), slots.to(torch.int32))

    def prefill(self, tokens: list[int]) -> tuple[Req, list[int]]:
        """A prompt no prefix of which is cached: its slots, the first output token, the prompt into the tree."""
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        req = Req(tokens, self.next_row)
        self.next_row += 1
        key = RadixKey(req.origin_input_ids, None, limit=len(tokens) - 1)  # _compute_max_prefix_len
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        assert len(match.device_indices) == 0, "the replay's prompts share no prefix"
        req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
        self.cache.inc_lock_ref(req.last_node)  # PrefillAdder._req_inc_lock_ref
        slots = alloc_token_slots(self.cache, len(tokens))
        self.write(req, 0, slots)
        req.kv_committed_len = len(tokens)
        req.kv = SimpleNamespace(kv_allocated_len=len(tokens), swa_evicted_seqlen=0)
        req.output_ids.append(7)
        self.cache.cache_unfinished_req(req)
        return req, slots.tolist()

    def verify(self, req: Req, accepted: int) -> None:
        """eagle_prepare_for_decode's window, then the verify's commit of ``accepted`` tokens."""
        from sglang.srt.mem_cache.allocation import alloc_token_slots

        cur = req.kv.kv_allocated_len
        nxt = max(cur, req.kv_committed_len + RESERVE)
        if nxt > cur:
            self.write(req, cur, alloc_token_slots(self.cache, nxt - cur))
            req.kv.kv_allocated_len = nxt
        req.kv_committed_len += accepted
        req.output_ids.extend([8] * accepted)

    def accounted(self) -> int:
        """What sglang's idle check adds up against the pool (available + evictable + protected)."""
        return self.allocator.available_size() + self.cache.evictable_size() + self.cache.protected_size()


def free_list(allocator) -> list[int]:
    return allocator.free_pages.tolist() + allocator.release_pages.tolist()


def case(eagle: bool, is_insert: bool) -> dict:
    from sglang.srt.mem_cache.common import release_kv_cache

    s = Scheduler(eagle)
    prompt = list(range(100, 112))
    req, _ = s.prefill(prompt)
    for accepted in ([3, 4, 2] if eagle else []):
        s.verify(req, accepted)
    committed = req.kv_committed_len
    row = s.rows.req_to_token[req.req_pool_idx].tolist()
    last_committed_slot = row[committed - 1]
    allocated = req.kv.kv_allocated_len
    before = free_list(s.allocator)
    release_kv_cache(req, s.cache, is_insert=is_insert)
    after = free_list(s.allocator)
    freed = after[len(before):] if after[: len(before)] == before else None
    accounted = s.accounted()
    # Two later prefills take the free list in order: the first up to and including the last committed slot's
    # first copy on the list, the second the next slots.
    first = after.index(last_committed_slot) + 1 if last_committed_slot in after else 1
    b, b_slots = s.prefill([200 + i for i in range(first)])
    c, c_slots = s.prefill([300, 301, 302])
    shared = sorted(set(b_slots) & set(c_slots))
    return {"eagle": eagle, "is_insert": is_insert, "committed": committed, "allocated": allocated,
            "last_committed_slot": last_committed_slot, "freed": freed,
            "times_on_free_list": after.count(last_committed_slot), "accounted_after_release": accounted,
            "pool": POOL, "slots_of_two_requests": shared,
            "b_positions_of_shared": [i for i, x in enumerate(b_slots) if x in shared],
            "c_positions_of_shared": [i for i, x in enumerate(c_slots) if x in shared]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_parent", type=Path)
    parser.add_argument("deps", type=Path)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(args.package_parent), str(args.deps), str(REPO)]
    from tests.runtime.real_sglang import sglang_site

    sglang_site._define_torchvision_ops_if_native_part_missing()
    import sglang.srt.mem_cache.common as common

    spec = {"algo": None}
    common.get_spec = lambda: SimpleNamespace(speculative_algorithm=spec["algo"])
    common.get_serving = lambda: SimpleNamespace(strip_thinking_cache=False)
    cases = []
    for eagle, is_insert in [(True, True), (True, False), (False, True)]:
        spec["algo"] = "EAGLE" if eagle else None
        cases.append(case(eagle, is_insert))
    print(json.dumps({"sglang": common.__file__, "cases": cases}))


if __name__ == "__main__":
    main()
