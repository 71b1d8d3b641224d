"""Device-to-host reads one step late: snapshot on the main stream, copy on a side stream.

At the end of step N the main stream copies the small status vector (ring count, run
counters, verify counts, SWA divergence) into a snapshot buffer; a side stream waits for
that and copies it into pinned host memory. The host reads it at the end of step N+1, by
which time the copy is normally long done, so the main stream never waits for the host.
On CPU the same structure holds with plain copies. Per step that is one device-to-device copy
and one device-to-host copy; the events are created once and re-recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class _Slot:
    device_copy: Any
    host_copy: Any
    main_done: Any = None  # event on the main stream after the snapshot copy (created once, re-recorded)
    host_done: Any = None  # event on the side stream after the D2H copy (created once, re-recorded)
    tag: Any = None
    recorded: bool = False
    host_numpy: Any = None  # numpy view of host_copy, made once: reading it per step then needs no torch op


@dataclass
class Snapshot:
    tag: Any
    values: list  # the status vector, as Python ints
    _slot: Optional[_Slot] = field(default=None, repr=False)


class DelayedReadback:
    """Snapshots of ``status`` read one step late; ``ring`` read on demand behind a snapshot."""

    def __init__(self, status: Any, ring: Any):
        import torch

        self.status = status
        self.ring = ring
        self.cuda = status.device.type == "cuda"
        self._side = torch.cuda.Stream(device=status.device) if self.cuda else None
        pin = self.cuda
        self._slots = [
            _Slot(
                device_copy=torch.zeros_like(status),
                host_copy=torch.zeros(status.shape, dtype=status.dtype, pin_memory=pin),
                main_done=torch.cuda.Event() if self.cuda else None,
                host_done=torch.cuda.Event() if self.cuda else None,
            )
            for _ in range(2)
        ]
        for slot in self._slots:
            slot.host_numpy = slot.host_copy.numpy()
        self._ring_done = torch.cuda.Event() if self.cuda else None
        self._ring_host = torch.zeros(ring.shape, dtype=ring.dtype, pin_memory=pin)
        self._next = 0
        self._pending: list[_Slot] = []

    def take(self, tag: Any) -> None:
        """Snapshot the status now (in main-stream order) and start its copy to the host."""
        import torch

        if len(self._pending) >= len(self._slots):
            raise RuntimeError("kv canary: readback snapshots must be harvested before more are taken")
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        slot.tag = tag
        if self.cuda:
            slot.device_copy.copy_(self.status)
            slot.main_done.record()
            with torch.cuda.stream(self._side):
                self._side.wait_event(slot.main_done)
                slot.host_copy.copy_(slot.device_copy, non_blocking=True)
                slot.host_done.record(self._side)
            slot.recorded = True
        else:
            # The same two copies as on CUDA, so op counts measured on CPU hold there.
            slot.device_copy.copy_(self.status)
            slot.host_copy.copy_(slot.device_copy)
        self._pending.append(slot)

    def pending(self) -> int:
        return len(self._pending)

    def harvest(self) -> Optional[Snapshot]:
        """The oldest snapshot not yet read (waits for its side-stream copy only), or None."""
        if not self._pending:
            return None
        slot = self._pending.pop(0)
        if slot.recorded:
            slot.host_done.synchronize()
        return Snapshot(tag=slot.tag, values=slot.host_numpy.tolist(), _slot=slot)

    def read_ring(self, snapshot: Snapshot) -> Any:
        """The violation ring as of ``snapshot`` (records written later may also show, never older ones lost)."""
        import torch

        slot = snapshot._slot
        if not self.cuda or slot is None or not slot.recorded:
            self._ring_host.copy_(self.ring)
            return self._ring_host.clone()
        with torch.cuda.stream(self._side):
            self._side.wait_event(slot.main_done)
            self._ring_host.copy_(self.ring, non_blocking=True)
            self._ring_done.record(self._side)
        self._ring_done.synchronize()
        return self._ring_host.clone()
