"""sglang's ``Req`` as the CPU replays of the corpus's bugs model it (``evict_replay.py``, ``eagle_free_replay.py``,
each run as a script beside this module): the fields that the radix cache's caching calls and
``release_kv_cache`` read and write, and nothing of the scheduler's."""

from __future__ import annotations

from array import array


class Req:
    """The fields of sglang's ``Req`` that the radix cache's caching calls and ``release_kv_cache`` read."""

    def __init__(self, tokens: list[int], row: int):
        self.origin_input_ids = array("q", tokens)
        self.output_ids = array("q")
        self.extra_key = None
        self.priority = 0
        self.req_pool_idx = row
        self.prefix_indices = None
        self.last_node = None
        self.cache_protected_len = 0
        self.extend_end = len(tokens)  # extend_range.end after a whole (unchunked) prefill
        self.kv_committed_len = 0
        self.kv = None  # spec v2's allocation record (kv_allocated_len): set by a replay that allocates past it
        self.mamba_pool_idx = None

    def get_fill_ids(self) -> array:  # full_untruncated_fill_ids[: extend_range.end]
        return (self.origin_input_ids + self.output_ids)[: self.extend_end]

    def effective_kv_committed_len(self) -> int:  # no thinking-strip
        return self.kv_committed_len
