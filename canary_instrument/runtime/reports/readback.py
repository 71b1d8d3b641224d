"""Tagged status snapshots read late without ever blocking: one async copy, read when done.

Violations reach the host without these (the post-forward passes publish into host-visible
memory, status.py); a snapshot ties the status to a step for the health check, the stats line
and the SWA line. At the end of a snapshot step N the current stream copies the small status
vector (ring count, run counters, verify counts, SWA divergence; ``status.STATUS``) into a
pinned host slot with one non-blocking copy and records an event. At the end of a later step the host takes the oldest
slot whose event has completed (``Event.query``, never a wait); a slot whose copy is not done
yet simply stays pending. The counters are cumulative, so a snapshot that is read late or not
taken (all slots busy: the device is several steps behind) loses nothing. On CPU the copy is
synchronous and every slot is ready at once, so a snapshot is read at the next step.

The violation ring is copied only when a snapshot shows new records (the rare path); that copy
runs on a side stream behind the snapshot's event and is waited for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

SLOTS = 4  # pinned snapshots in flight; more than the device is ever behind in a healthy engine


@dataclass
class _Slot:
    host_copy: Any  # pinned host tensor
    host_numpy: Any  # numpy view of host_copy, made once: reading it then needs no torch op
    done: Any = None  # CUDA event after the copy (created once, re-recorded); None on CPU
    tag: Any = None


@dataclass
class Snapshot:
    tag: Any
    values: Any  # the status vector as a numpy int64 view (valid until the slot is taken again)
    _slot: Optional[_Slot] = field(default=None, repr=False)


class DelayedReadback:
    """Snapshots of ``status`` read one step late; ``ring`` read on demand behind a snapshot."""

    def __init__(self, status: Any, ring: Any, slots: int = SLOTS):
        import torch

        self.status = status
        self.ring = ring
        self.cuda = status.device.type == "cuda"
        self._slots = []
        for _ in range(slots):
            host = torch.zeros(status.shape, dtype=status.dtype, pin_memory=self.cuda)
            self._slots.append(_Slot(host, host.numpy(), torch.cuda.Event() if self.cuda else None))
        self._free = list(self._slots)
        self._pending: list[_Slot] = []
        self._side = torch.cuda.Stream(device=status.device) if self.cuda else None
        self._ring_done = torch.cuda.Event() if self.cuda else None
        self._ring_host = torch.zeros(ring.shape, dtype=ring.dtype, pin_memory=self.cuda)

    def take(self, tag: Any) -> bool:
        """Start copying the status (in stream order); False when every slot is still in flight."""
        import torch

        if not self._free:
            return False
        slot = self._free.pop()
        slot.tag = tag
        slot.host_copy.copy_(self.status, non_blocking=self.cuda)
        if self.cuda:
            slot.done.record(torch.cuda.current_stream(self.status.device))
        self._pending.append(slot)
        return True

    def pending(self) -> int:
        return len(self._pending)

    def harvest(self, wait: bool = False) -> Optional[Snapshot]:
        """The oldest snapshot whose copy has completed (``wait``: wait for it), or None."""
        if not self._pending:
            return None
        slot = self._pending[0]
        if slot.done is not None:
            if wait:
                slot.done.synchronize()
            elif not slot.done.query():
                return None
        self._pending.pop(0)
        self._free.append(slot)
        return Snapshot(tag=slot.tag, values=slot.host_numpy, _slot=slot)

    def read_ring(self, snapshot: Optional[Snapshot] = None) -> Any:
        """The violation ring as of ``snapshot`` (records written later may also show, never older ones
        lost); without one, as it is now: for a count read from the published mirror, whose records were
        complete before the count was published, so the copy waits for nothing on the main stream."""
        import torch

        slot = snapshot._slot if snapshot is not None else None
        if not self.cuda:
            self._ring_host.copy_(self.ring)
            return self._ring_host.clone()
        with torch.cuda.stream(self._side):
            if slot is not None:
                self._side.wait_event(slot.done)
            self._ring_host.copy_(self.ring, non_blocking=True)
            self._ring_done.record(self._side)
        self._ring_done.synchronize()
        return self._ring_host.clone()
