"""Small bugs in sglang's own KV bookkeeping, for running the real server with them (issue 36's corpus).

    python bench/sglang_server/bugs.py SRC_PACKAGE DEST_PACKAGE BUG     # a copy of the package, with BUG in it
    python bench/sglang_server/bugs.py --list

Each bug is one edit of the release's source: the exact text it replaces and what it puts there, so a
release whose code moved is refused (exit 1) rather than patched somewhere else. The copy is the package
as given (unmodified for canary off and sglang's own canary, the instrumented one for ours).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bug:
    path: str  # under the package's srt/
    old: str
    new: str
    what: str


BUGS = {
    # Every decode step writes each request's new slot one position early in req_to_token: the previous
    # token's entry is overwritten and the new position keeps whatever it held. Attention reads a wrong
    # slot at every step for every request: the flood.
    "decode_table_shift": Bug(
        "mem_cache/allocation.py",
        "        locs = seq_lens_gpu.clone()\n",
        "        locs = seq_lens_gpu - 1\n",
        "decode's req_to_token write lands one position early",
    ),
    # Prefix matching hands back one slot too few for every node it matches whole: the request's prefix
    # indices and the node it locks disagree.
    "radix_match_short": Bug(
        "mem_cache/radix_cache.py",
        "            else:\n                value.append(child.value)\n                node = child\n",
        "            else:\n                value.append(child.value[:-1] if len(child.value) > 1 else child.value)\n"
        "                node = child\n",
        "radix prefix match returns one slot short per whole node",
    ),
    # A node split hands the new (shared-prefix) node its slots in reverse order: every later request that
    # matches the prefix reads the right slots at the wrong positions. sglang has nothing that checks.
    "radix_split_reversed": Bug(
        "mem_cache/radix_cache.py",
        "        new_node.value = child.value[:split_len].clone()\n",
        "        new_node.value = child.value[:split_len].flip(0).clone()\n",
        "radix node split reverses the shared prefix's slots",
    ),
    # Eviction walks up to a parent whose children are gone without asking whether a running request still
    # holds it locked: slots freed while a request reads them, handed to the next one.
    "radix_evict_locked_parent": Bug(
        "mem_cache/radix_cache.py",
        "            if len(x.parent.children) == 0 and x.parent.lock_ref == 0:\n",
        "            if len(x.parent.children) == 0:\n",
        "radix eviction frees a parent that a running request still holds",
    ),
    # Insert frees the finished request's whole inserted range, not only the part the tree already held: the
    # tree keeps slots the allocator hands out again, and the next request that matches the prefix reads KV
    # another request has overwritten.
    "radix_insert_frees_new": Bug(
        "mem_cache/radix_cache.py",
        "                    kv_indices[req.cache_protected_len : freed_end],\n",
        "                    kv_indices[req.cache_protected_len : key_len],\n",
        "radix insert frees the slots it has just put into the tree",
    ),
    # The token allocator puts each freed slot's neighbour back on the free list instead of the slot: the
    # slot leaks, and the neighbour, still in use, is handed out again.
    "allocator_free_neighbour": Bug(
        "mem_cache/allocator/token.py",
        "                self.free_pages = torch.cat((self.free_pages, free_index))\n",
        "                self.free_pages = torch.cat((self.free_pages, free_index + 1))\n",
        "token allocator frees each slot's neighbour instead of the slot",
    ),
    # SWA translation: each allocation maps every full slot to its predecessor's SWA slot, so its first two
    # positions share one SWA slot (in a decode batch, two requests write their sliding-window KV to one row)
    # and its last SWA slot is never mapped. The free counts stay balanced (the shared slot is freed twice, the
    # unmapped one never), so sglang's own leak check is satisfied while the free list gains duplicates.
    "swa_mapping_shifted": Bug(
        "mem_cache/allocator/swa.py",
        "        self.set_full_to_swa_mapping(alloc_full_indices, alloc_swa_indices)\n        return alloc_full_indices\n",
        "        self.set_full_to_swa_mapping(\n"
        "            alloc_full_indices, torch.cat([alloc_swa_indices[:1], alloc_swa_indices[:-1]])\n"
        "        )\n"
        "        return alloc_full_indices\n",
        "SWA allocation maps each full slot to its predecessor's SWA slot (two positions share one)",
    ),
    # Prefill and chunked prefill: after a request's tokens go into the radix cache, the duplicate slots it
    # computed are freed and the tree's are reused, but req_to_token keeps the freed ones: the request's
    # next chunk or decode reads slots the allocator hands to other requests.
    "prefill_table_stale": Bug(
        "mem_cache/radix_cache.py",
        "        self.req_to_token_pool.write(\n"
        "            (req.req_pool_idx, slice(req.cache_protected_len, len(new_indices))),\n"
        "            new_indices[req.cache_protected_len :],\n"
        "        )\n",
        "",
        "req_to_token keeps a cached request's freed duplicate slots",
    ),
    # EAGLE accept: each verify commits one token more than it accepted (at most the draft's length): the
    # request's length then covers a position whose KV the verify computed from a rejected draft token.
    "eagle_accept_one_more": Bug(
        "speculative/eagle_worker_common.py",
        "    new_seq_lens = batch.seq_lens + accept_lens\n",
        "    new_seq_lens = batch.seq_lens + torch.clamp(accept_lens + 1, max=num_draft_tokens)\n",
        "EAGLE verify commits one token more than it accepted",
    ),
    # EAGLE free: when a request finishes (or is retracted), the release of its over-allocated verify window starts
    # one slot early, at its last committed position. EAGLE's radix keys are bigrams, so the insert keeps every
    # committed slot but that last one, which cache_finished_req has just freed itself: that slot is freed twice
    # and sits twice on the free list, and the next allocations hand it to two owners (two requests, or two
    # positions of one). Only a request with an over-allocated tail reaches the line (speculative decoding, or the
    # thinking strip), so serving without either is untouched; the free count grows by one a request, which
    # sglang's idle leak check sees.
    "eagle_release_one_early": Bug(
        "mem_cache/common.py",
        "        indices_to_free = tree_cache.req_to_token_pool.req_to_token[req.req_pool_idx][\n"
        "            start_p:end_p\n        ]\n",
        "        indices_to_free = tree_cache.req_to_token_pool.req_to_token[req.req_pool_idx][\n"
        "            start_p - 1 : end_p\n        ]\n",
        "EAGLE release frees the over-allocated tail from the last committed slot (freed twice)",
    ),
    # HiCache host transfer: a load back from the host tier writes the KV into the new device slots in reverse
    # order, while the tree records them in order: every loaded prefix is read at the wrong positions.
    "hicache_load_reversed": Bug(
        "managers/cache_controller.py",
        "        self.load_queue.append(\n            CacheOperation(host_indices, device_indices, node_id, priority)\n",
        "        self.load_queue.append(\n"
        "            CacheOperation(host_indices, device_indices.flip(0), node_id, priority)\n",
        "HiCache load-back writes into the device slots in reverse order",
    ),
}

# Bugs once in the corpus and dropped, with why: their archived runs stay readable in the report.
RETIRED = {
    "radix_insert_leak": "dropped: a finished request's duplicate prefix left unfreed is a leak, not a corruption: no "
                         "slot is read or written by two owners, so there is nothing for a KV canary to see (sglang's "
                         "idle memory check is the tool for it; it did not fire in these runs); "
                         "`radix_insert_frees_new` breaks the same insert path",
    "swa_mapping_reversed": "dropped: reversing an allocation's SWA slots keeps the mapping one-to-one, and "
                            "sglang writes, reads and frees through it alike, so nothing is corrupted",
}


def apply(package: Path, name: str) -> None:
    bug = BUGS[name]
    path = package / "srt" / bug.path
    text = path.read_text()
    if text.count(bug.old) != 1:
        raise SystemExit(f"bugs: {name}: {path} holds the text it replaces {text.count(bug.old)} times, not once")
    path.write_text(text.replace(bug.old, bug.new))


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        for name, bug in BUGS.items():
            print(f"{name}: {bug.what} ({bug.path})")
        return 0
    if len(argv) != 3 or argv[2] not in BUGS:
        print(f"usage: bugs.py SRC_PACKAGE DEST_PACKAGE BUG (one of {', '.join(BUGS)})", file=sys.stderr)
        return 2
    source, dest, name = Path(argv[0]), Path(argv[1]), argv[2]
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True)
    apply(dest, name)
    print(f"bugs: {dest}: {BUGS[name].what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
