"""Replay ``serve.py evict``'s order of events on sglang's own radix cache and token allocator, on the CPU.

    python tests/bench/evict_replay.py PACKAGE_PARENT DEPS [--pool 4096] [--chunk 2048]

PACKAGE_PARENT holds an ``sglang`` package (the release, or a copy with a bug of ``bugs.py`` in it), DEPS the
packages its memory-cache modules import (``tests/runtime/real_sglang/sglang_site.py``). Run as its own process:
the real-class tests import another sglang release into theirs. Prints one JSON object: a replay per case.

What is sglang's and what is modelled. sglang's: ``RadixCache`` (``match_prefix``, ``inc_lock_ref``,
``cache_unfinished_req``, ``cache_finished_req``, ``evict``), ``TokenToKVPoolAllocator``, ``ReqToTokenPool``, and
``alloc_token_slots`` (``evict_from_tree_cache`` then ``alloc``: every prefill and decode allocation of a page-1
pool goes through it, and ``check_decode_mem``'s eviction asks the same shortfall first). Modelled, as the
scheduler does them for these requests: admission (``init_next_round_input``'s match capped at the prompt
less one token, ``PrefillAdder``'s lock on the matched node), the order of prefill and decode steps (the
client's order: each step waits for the one before), the request slots (one row each), and, with
``overlap``, the decode slot the overlap scheduler gives a request that finished at its prefill.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from replay_req import Req  # beside this script (its folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]


def serve_module():
    spec = importlib.util.spec_from_file_location("bench_sglang_server_serve", REPO / "bench/sglang_server/serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Scheduler:
    def __init__(self, pool: int):
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache

        self.allocator = TokenToKVPoolAllocator(pool, torch.float16, "cpu", kvcache=None, need_sort=False)
        self.rows = ReqToTokenPool(size=16, max_context_len=pool + 8, device="cpu", enable_memory_saver=False)
        self.cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.rows,
                                                token_to_kv_pool_allocator=self.allocator, page_size=1))
        self.evictions: list[dict] = []
        evict = self.cache.evict

        def recorded(params):  # the real eviction, each call recorded with what it was asked for
            result = evict(params)
            self.evictions.append({"asked": int(params.num_tokens), "evicted": int(result.num_tokens_evicted),
                                   "during": self.phase})
            return result

        self.cache.evict = recorded
        self.phase = "start"
        self.next_row = 0
        self.running: list[Req] = []

    def alloc(self, n: int):
        from sglang.srt.mem_cache.allocation import alloc_token_slots

        return alloc_token_slots(self.cache, n)

    def prefill(self, tokens: list[int], max_new: int, overlap: bool = False) -> tuple[Req, "object"]:
        """Admission, one whole prefill, its result: finished (one new token) or cached and running."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        req = Req(tokens, self.next_row)
        self.next_row += 1
        key = RadixKey(req.origin_input_ids, None, limit=len(tokens) - 1)  # _compute_max_prefix_len
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        req.prefix_indices, req.last_node = match.device_indices, match.last_device_node
        req.cache_protected_len = len(req.prefix_indices)
        self.cache.inc_lock_ref(req.last_node)  # PrefillAdder._req_inc_lock_ref
        prefix = len(req.prefix_indices)
        out = self.alloc(len(tokens) - prefix)
        self.rows.write((req.req_pool_idx, slice(0, prefix)), req.prefix_indices.to(self.rows.req_to_token.dtype))
        self.rows.write((req.req_pool_idx, slice(prefix, len(tokens))), out.to(self.rows.req_to_token.dtype))
        req.kv_committed_len = len(tokens)
        req.output_ids.append(7)
        if max_new == 1:
            if overlap:  # the overlap scheduler's next decode batch held it before its result was read
                slot = self.alloc(1)
                self.rows.write((req.req_pool_idx, slice(len(tokens), len(tokens) + 1)), slot.to(torch_int32()))
                req.kv_committed_len += 1
            self.cache.cache_finished_req(req, kv_len_to_handle=req.kv_committed_len)
        else:
            self.cache.cache_unfinished_req(req)
            self.running.append(req)
        return req, out

    def decode(self, steps: int) -> None:
        for _ in range(steps):
            slots = self.alloc(len(self.running))
            for req, slot in zip(self.running, slots):
                self.rows.write((req.req_pool_idx, slice(req.kv_committed_len, req.kv_committed_len + 1)),
                                slot.reshape(1).to(torch_int32()))
                req.kv_committed_len += 1
                req.output_ids.append(7)

    def slots(self, req: Req) -> list[int]:
        return self.rows.req_to_token[req.req_pool_idx, : req.kv_committed_len].tolist()

    def in_tree(self, node) -> bool:
        while node is not self.cache.root_node:
            parent = node.parent
            if parent is None or node not in parent.children.values():
                return False
            node = parent
        return True


def torch_int32():
    import torch

    return torch.int32


def replay(plan: dict, decoded: tuple[int, int, int], overlap: bool) -> dict:
    """``serve.py evict`` with ``decoded`` held's decode steps before the child, before the fills and before new."""
    s = Scheduler(plan["pool"])
    s.phase = "held"
    held, _ = s.prefill(plan["held"], plan["a_new"])
    locked = held.last_node
    s.decode(decoded[0])
    s.phase = "child"
    s.prefill(plan["child"], 1, overlap)
    child_nodes = list(locked.children.values())
    s.decode(decoded[1])
    s.phase = "fills"
    for fill in plan["fills"]:
        s.prefill(fill, 1, overlap)
    s.decode(decoded[2])
    free_before_new = s.allocator.available_size()
    s.phase = "new"
    new, new_slots = s.prefill(plan["new"], plan["n_new"])
    s.phase = "decode after new"
    s.decode(1)  # held reads its whole row again; new reads its own
    held_prompt = s.slots(held)[: len(plan["held"])]
    reused = sorted(set(held_prompt) & set(new_slots.tolist()))
    return {"decoded": list(decoded), "overlap": overlap, "locked_len": len(locked.key),
            "child_len": sum(len(c.key) for c in child_nodes), "free_before_new": free_before_new,
            "evictions": s.evictions, "locked_lock_ref": locked.lock_ref, "locked_in_tree": s.in_tree(locked),
            "held_running": held in s.running, "held_prompt_slots_given_to_new": len(reused),
            "held_prompt_slots": len(held_prompt)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_parent", type=Path)
    parser.add_argument("deps", type=Path)
    parser.add_argument("--pool", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=2048)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(args.package_parent), str(args.deps), str(REPO)]
    from tests.runtime.real_sglang import sglang_site

    sglang_site._define_torchvision_ops_if_native_part_missing()
    import sglang.srt.mem_cache.radix_cache as radix_cache

    plan = serve_module().evict_plan(args.pool, args.chunk)
    last = plan["a_new"] - 1  # held decodes at most a_new tokens; one step is left for after new
    cases = [((0, 0, 0), False), ((3, 5, 9), True), ((last // 3, last // 3, last - 2 * (last // 3)), True),
             ((0, 0, last), False)]
    out = {"sglang": radix_cache.__file__, "plan": {k: plan[k] for k in ("pool", "chunk", "left", "a_new")},
           "replays": [replay(plan, decoded, overlap) for decoded, overlap in cases]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
