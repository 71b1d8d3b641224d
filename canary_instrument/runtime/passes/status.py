"""The status vector's layout and the one reader of the packed words the post-forward passes publish.

Every device counter the host reads lives in one int64 buffer (``STATUS``), so one copy snapshots
it all. Every post-forward pass also leaves, in host-visible memory (``state.published``, pinned on
CUDA), a copy of the status and one packed word ``ring_count & 0xFFFFFFFF | post_runs << 32`` at
slot ``len(STATUS) + post_runs % PUBLISH_SLOTS``; ``PublishedWords`` is the only code that decodes
those words.
"""

from __future__ import annotations

from typing import Any, Callable

from canary_instrument.runtime.passes.state import CanaryState

# A new counter is a new name appended at the end.
STATUS = (
    "ring_count",  # violation records made (cumulative; the ring keeps the last RING of them)
    "pre_runs", "post_runs", "verified", "written",  # state.counters
    "verified_full", "verified_swa",  # state.group_verified
    "swa_remapped", "swa_out_of_window",  # SWA divergence, written when a report is due
    "sweep_launches", "sweep_rows", "sweep_entries",  # idle-cache sweep (sweep.py's counters)
)
AT = {name: i for i, name in enumerate(STATUS)}
RING_COUNT = slice(AT["ring_count"], AT["ring_count"] + 1)
COUNTERS = slice(AT["pre_runs"], AT["written"] + 1)
GROUP_VERIFIED = slice(AT["verified_full"], AT["verified_swa"] + 1)
SWA = slice(AT["swa_remapped"], AT["swa_out_of_window"] + 1)
SWEEP = slice(AT["sweep_launches"], AT["sweep_entries"] + 1)

# Pass number p publishes into slot p % PUBLISH_SLOTS, so a host that reads a few steps late (or after a
# multi-step EAGLE draft) still finds every pass's word.
PUBLISH_SLOTS = 64
_PACKED = len(STATUS)  # first packed word of the published mirror
_LOW32 = 0xFFFFFFFF


def allocate_status(state: CanaryState, ring_size: int, device: Any) -> Any:
    """Make the status vector, the violation ring and the published mirror, and hang them (and the
    status's views) on ``state``; returns the status vector."""
    import torch

    status = torch.zeros(len(STATUS), dtype=torch.int64, device=device)
    state.ring = torch.zeros((ring_size, 8), dtype=torch.int64, device=device)
    state.status = status
    state.ring_count = status[RING_COUNT]
    state.counters = status[COUNTERS]
    state.group_verified = status[GROUP_VERIFIED]
    # The kernels store to the pinned mirror through its mapped address; the host reads it with numpy.
    state.published = torch.zeros(len(STATUS) + PUBLISH_SLOTS, dtype=torch.int64,
                                  pin_memory=status.device.type == "cuda")
    state.publish_done = torch.zeros(1, dtype=torch.int64, device=device)
    return status


class PublishedWords:
    """How far the host has read the published words: ``passes`` (post-forward passes read) and
    ``seen`` (violation records read). Both halves of a word are the device's cumulative counts
    modulo 2**32."""

    __slots__ = ("words", "passes", "seen")

    def __init__(self, published: Any):
        self.words = memoryview(published.numpy())  # indexing gives a Python int, no torch op
        self.passes = 0
        self.seen = 0

    def poll(self, planned: int, read: Callable[[int, int], None]) -> bool:
        """Read the word of every pass up to ``planned`` published since the last read, in pass order;
        where the violation count moved, ``read(count, pass_number)`` (which calls ``mark_read``). True
        when it called ``read``."""
        words = self.words
        passes = self.passes
        moved = False
        while passes < planned:
            nxt = passes + 1
            word = words[_PACKED + nxt % PUBLISH_SLOTS]
            behind = (((word >> 32) & _LOW32) - nxt) & _LOW32
            if behind >= 1 << 31:
                break  # pass nxt has not published yet
            if behind:
                # Read too late: the slot holds a later pass. Its count covers the passes skipped; their
                # violations get its step.
                nxt += behind
            passes = nxt
            ahead = ((word & _LOW32) - self.seen) & _LOW32
            if ahead and ahead < 1 << 31:  # a snapshot may have read further already
                read(self.seen + ahead, nxt)
                moved = True
        self.passes = passes
        return moved

    def mark_read(self, count: int) -> int:
        """Records up to ``count`` are read now; returns the first that was not read before."""
        first, self.seen = self.seen, count
        return first
