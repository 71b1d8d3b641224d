"""The free mailbox: KV frees handed to the next pass by address, with no device op on the host.

A free the allocator wrapper notes (request_side.py) must reach the pre-forward pass of the next forward,
which on the usual path replays a CUDA graph whose arguments are fixed. Copying the slots into a fixed
device buffer is one device op per free, and on an EAGLE step's path (a free of the rejected drafts
every step) that op alone costs more host time than the rest of the step's canary. Here the host
instead writes the slots tensor's address and length into host-visible memory (pinned on CUDA) and keeps
the tensor alive; the mark kernel of the pass reads them there and marks the rows.

The protocol rests on the pass numbers the host and the device already share (status.py): pass ``t`` is
the ``t``-th enabled pre/post-forward pass since init, counted by the host when its site is left and by
the device's ``post_runs``. A free noted while no site is open comes after every pass launched so far
(``planned``) and before the next, so it is posted under tag ``planned + 1`` in row ``tag % ROWS``: a
row holds one tag, how many pairs it uses, and up to ``PAIRS`` (address, count) pairs. Pass ``t``'s mark kernel reads row
``t % ROWS`` and takes it only when its tag is ``t``; a pass launched before the free has a smaller
number and leaves it alone, so the finishing request's in-flight forward never sees its own free. A row
is reused once its pass has published (the host read its word), and a posted tensor is dropped then.
Where a row is still in use or full, the caller falls back to the copy.
"""

from __future__ import annotations

from collections import deque
from typing import Any

ROWS = 64  # passes whose frees can wait in the mailbox at once (the device may run this far behind)
PAIRS = 4  # frees per pass posted by address; a pass's further frees take the copy
WORDS = 2 + 2 * PAIRS  # int64 per row: tag, pairs used, then the (address, count) pairs


def make_mailbox(device: Any) -> Any:
    """The mailbox, int64 [ROWS, WORDS] zeros: pinned host memory for a CUDA device (the kernel reads it
    through its mapped address), plain memory otherwise (the Triton interpreter's tests)."""
    import torch

    return torch.zeros((ROWS, WORDS), dtype=torch.int64, pin_memory=torch.device(device).type == "cuda")


class FreeMail:
    """The host's side of the mailbox: posts, the tensors kept alive for them, and their release."""

    __slots__ = ("box", "_words", "_tags", "_used", "_kept")

    def __init__(self, box: Any):
        self.box = box
        self._words = memoryview(box.numpy()).cast("B").cast("q")  # flat int64 stores: no torch op
        # Each row's tag and pairs used, as the host last wrote them: read here, not from the box (a read of
        # host memory mapped for the device can cost far more than a store to it).
        self._tags = [0] * ROWS
        self._used = [0] * ROWS
        self._kept: deque = deque()  # (tag, slots tensor) until pass `tag` has published, in tag order

    def post(self, tag: int, slots: Any, published: int) -> bool:
        """Post ``slots`` (a contiguous int64 tensor on the mailbox's device) for pass ``tag``; False where
        row ``tag % ROWS`` holds an unpublished pass's frees or this pass's row is full (copy instead).
        ``published``: the last pass whose word the host has read."""
        row = tag % ROWS
        held = self._tags[row]
        if held == tag:
            pair = self._used[row]
            if pair == PAIRS:
                return False
        elif held == 0 or held <= published:
            # A free row, or one whose pass has read it: no launched pass looks for this tag yet, and the
            # pass that read the old one has finished.
            pair = 0
        else:
            return False
        words, base = self._words, row * WORDS
        words[base + 2 + 2 * pair] = slots.data_ptr()
        words[base + 3 + 2 * pair] = slots.numel()
        words[base + 1] = self._used[row] = pair + 1
        words[base] = self._tags[row] = tag
        kept = self._kept
        while kept and kept[0][0] <= published:
            kept.popleft()
        kept.append((tag, slots))
        return True

    def take(self, tag: int) -> list:
        """The tensors posted for pass ``tag`` (not launched yet), their row emptied: for a caller that marks
        them now instead (HiCache's load, which must see them marked before its rows land)."""
        row = tag % ROWS
        if self._tags[row] != tag:
            return []
        words, base = self._words, row * WORDS
        words[base] = self._tags[row] = 0
        words[base + 1] = self._used[row] = 0
        taken = [slots for t, slots in self._kept if t == tag]
        self._kept = deque(entry for entry in self._kept if entry[0] != tag)
        return taken
