"""Hand the sampler's output to the device with no device op: the sample inbox.

Recording each request's sampled token used to cost one ``index_copy_`` per decode step, a CUDA
call issued right after the engine's graph launch and the largest piece of the canary's host time
(bench/runtime/RESULTS.md). Instead the host writes the addresses of the sampler's two tensors
(req-pool rows and tokens, which the engine already has on the device) into one entry of a small
ring in host-visible memory (pinned host memory on CUDA), keeps the tensors alive, and the next
pre-forward pass of the same runner files them into the sampled-token table from inside its
kernel (or its CUDA graph). Writing an entry is a few stores into a numpy array.

Entry ``n`` (the host's n-th sample, 0-based) lives in slot ``n % SLOTS`` as int64 fields:

    [0] n + 1 (0: the slot was never written), stored last: it publishes the entry
    [1] tag: the index of the first forward allowed to file it (post-forward passes planned
        before the sample), so a pass that the host launched before the sample never reads
        tokens the sampler has not produced yet
    [2] address of the req-pool rows, [3] address of the tokens (int32 or int64 elements, read
        as the low int32 word: both are small non-negative integers)
    [4] count, [5] rows stride, [6] tokens stride (in int32 words)

The device keeps ``taken`` (entries filed so far). A pre-forward pass whose index is ``q``
(post-forward passes done before it, the status counter ``post_runs``) files entries
``taken, taken + 1, ...`` while the slot holds that entry and its tag is at most ``q``. The
host reuses a slot only once it has read that the entry's forward finished (the published pass
count), so a slot is never rewritten under a pass that may still read it; a sample that would
have to is dropped (its check skipped, never a false report) and counted.
"""

from __future__ import annotations

from typing import Any

SLOTS = 64
FIELDS = 8
SEQ, TAG, ROWS, TOKENS, COUNT, ROWS_STRIDE, TOKENS_STRIDE = range(7)


class SampleInbox:
    """The ring of sample entries, the device's ``taken`` counter and the tensors kept alive."""

    def __init__(self, device: Any):
        import torch

        device = torch.device(device)
        self.entries = torch.zeros((SLOTS, FIELDS), dtype=torch.int64, pin_memory=device.type == "cuda")
        self.taken = torch.zeros(1, dtype=torch.int64, device=device)
        # The (rows, tokens) of each slot's entry, alive until the slot is reused: the device reads
        # them by address, possibly a few steps after the host let go of them.
        self.kept: list = [None] * SLOTS
        self._words = memoryview(self.entries.numpy().reshape(-1))  # item access gives a Python int
        self._int32 = torch.int32
        self._int64 = torch.int64
        self.sent = 0  # entries written
        self.dropped = 0  # samples not sent: their slot's entry was not known to be filed yet

    def send(self, rows: Any, tokens: Any, tag: int, forwards_done: int) -> bool:
        """Queue ``table[rows[b]] = tokens[b]`` for the first pre-forward pass whose index is >= ``tag``.

        ``forwards_done``: post-forward passes the host has read as finished. False (and counted in
        ``dropped``) when the slot's previous entry may still be unread."""
        n = self.sent
        slot = n % SLOTS
        words = self._words
        base = slot * FIELDS
        if n >= SLOTS and forwards_done <= words[base + TAG]:
            self.dropped += 1
            return False
        int32, int64 = self._int32, self._int64
        if rows.dtype is int32:
            rows_stride = rows.stride(0)
        elif rows.dtype is int64:
            rows_stride = 2 * rows.stride(0)
        else:
            raise TypeError(f"kv canary: sampled rows must be int32 or int64, got {rows.dtype}")
        if tokens.dtype is int32:
            tokens_stride = tokens.stride(0)
        elif tokens.dtype is int64:
            tokens_stride = 2 * tokens.stride(0)
        else:
            raise TypeError(f"kv canary: sampled tokens must be int32 or int64, got {tokens.dtype}")
        self.kept[slot] = (rows, tokens)
        words[base + TAG] = tag
        words[base + ROWS] = rows.data_ptr()
        words[base + TOKENS] = tokens.data_ptr()
        words[base + COUNT] = rows.shape[0]
        words[base + ROWS_STRIDE] = rows_stride
        words[base + TOKENS_STRIDE] = tokens_stride
        words[base + SEQ] = n + 1  # last: the entry is complete
        self.sent = n + 1
        return True

    def pending(self, forward: int) -> list[tuple[Any, Any]]:
        """Torch twin of the kernels' filing: the (rows, tokens) a pre-forward pass of index ``forward``
        files, in order; advances ``taken``."""
        taken = int(self.taken[0])
        out = []
        words = self._words
        while True:
            base = (taken % SLOTS) * FIELDS
            if words[base + SEQ] != taken + 1 or words[base + TAG] > forward:
                break
            out.append(self.kept[taken % SLOTS])
            taken += 1
        self.taken[0] = taken
        return out
