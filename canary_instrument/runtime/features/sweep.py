"""The idle-cache sweep: every N steps, verify one bounded slice of the slots the prefix cache holds unlocked.

Per-forward passes verify what running requests read; a cached prefix that no request reads is
checked by nobody until a request reuses it, by which time its corrupted KV has been read. The
sweep closes that gap: the host walks the cache (``radix_walk.RadixCursor``) a slice at a time,
the rows reach the device in one non-blocking copy from a pinned buffer (slots that live in device
tensors, as sglang keeps node values, are gathered on the device), and one kernel launch verifies
them and reports into the same violation ring as the per-forward passes (kernel ``sweep``).
Nothing waits for the device: the row count travels with the rows and the kernel reads it there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.features.radix_walk import UNKNOWN_PREV, FlatRows, RadixCursor, WalkSlice
from canary_instrument.runtime.features.sweep_buffers import SweepBuffers

logger = logging.getLogger("canary_instrument.runtime")


@dataclass(frozen=True)
class SweepProgress:
    passes: int  # full passes over the cache completed
    pass_rows: int  # rows handed to the device so far in the current pass
    rows_sent: int  # rows handed to the device since start


class SweepUpload:
    """The pinned host buffer a slice is written into and its device twin, sent with one non-blocking copy.

    One int64 buffer holds, in order: the row count, the rows (slot, position, prev_slot), and the
    row indices that device-resident slots and predecessors are gathered into. Device views have
    static addresses, so a captured sweep launch reads each new slice. The host side is double
    buffered; a host buffer is rewritten only after the copy that last read it has completed
    (sweeps are ``interval`` steps apart, so that wait finds the copy long done).
    """

    def __init__(self, capacity: int, device: Any):
        import torch

        self.capacity = capacity
        self.size = 1 + 3 * capacity + 2 * capacity
        self.cuda = torch.device(device).type == "cuda"
        self._device = torch.zeros(self.size, dtype=torch.int64, device=device)
        self.device = self._regions(self._device)
        self._host = [torch.zeros(self.size, dtype=torch.int64, pin_memory=self.cuda) for _ in range(2)]
        self._host_views = [self._regions(h.numpy()) for h in self._host]
        self._copied = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self._pending = [False, False]
        self._current = 0

    def _regions(self, flat: Any) -> dict:
        cap = self.capacity
        return {
            "count": flat[0:1],
            "rows": flat[1 : 1 + 3 * cap].reshape(cap, 3),
            "slot_dst": flat[1 + 3 * cap : 1 + 4 * cap],  # rows whose slot is gathered on the device
            "prev_dst": flat[1 + 4 * cap : 1 + 5 * cap],  # rows whose predecessor slot is gathered on the device
        }

    def begin(self) -> dict:
        """The other host buffer's regions (numpy views), once the copy that last read it has completed."""
        self._current ^= 1
        if self._pending[self._current]:
            self._copied[self._current].synchronize()
            self._pending[self._current] = False
        return self._host_views[self._current]

    def send(self, words: int) -> None:
        """Copy the first ``words`` int64 of the current host buffer to the device (non-blocking on CUDA)."""
        self._device[:words].copy_(self._host[self._current][:words], non_blocking=self.cuda)
        if self.cuda:
            self._copied[self._current].record()
            self._pending[self._current] = True


def sweep_ops(device: Any, backend: Optional[str] = None):
    """The sweep backend that matches the per-forward passes' choice (``ops.resolve_backend``)."""
    from canary_instrument.runtime.passes.ops import resolve_backend

    if resolve_backend(device, backend) == "triton":
        from canary_instrument.runtime.features.sweep_triton import TritonSweepOps

        return TritonSweepOps()
    from canary_instrument.runtime.features.sweep_reference import TorchSweepOps

    return TorchSweepOps()


class Sweeper:
    """Sweeps one manager's canary rows: ``maybe_sweep(step, cache)`` at step end, before the status snapshot.

    ``interval`` steps between sweeps (0 = off), ``slots_per_sweep`` rows per sweep (the host's walk
    and the device's work are both bounded by it). ``counters`` may be a view into the manager's
    status buffer, so the step's one snapshot carries the sweep figures too.
    """

    def __init__(self, state: Any, *, interval: int, slots_per_sweep: int, ops: Any = None,
                 counters: Any = None, backend: Optional[str] = None):
        import torch

        if interval < 0:
            raise ValueError(f"kv canary sweep: interval must be >= 0 (0 = off); got {interval}")
        if slots_per_sweep < 1:
            raise ValueError(f"kv canary sweep: slots per sweep must be >= 1; got {slots_per_sweep}")
        self.state = state
        self.interval = interval
        self.capacity = slots_per_sweep
        device = state.req_to_token.device
        self.ops = ops if ops is not None else sweep_ops(device, backend)
        self._upload = SweepUpload(slots_per_sweep, device)
        if counters is None:
            counters = torch.zeros(3, dtype=torch.int64, device=device)
        self.buffers = SweepBuffers(count=self._upload.device["count"], rows=self._upload.device["rows"],
                                    counters=counters)
        self._cursor: Optional[RadixCursor] = None
        self._rows_sent = 0
        self._told_unwalkable = False

    @property
    def progress(self) -> SweepProgress:
        cursor = self._cursor
        return SweepProgress(
            passes=cursor.passes if cursor else 0, pass_rows=cursor.pass_rows if cursor else 0, rows_sent=self._rows_sent
        )

    def due(self, step: int) -> bool:
        return self.interval != 0 and step % self.interval == 0

    def maybe_sweep(self, step: int, cache: Any) -> int:
        """Sweep one slice if ``step`` is due and a walkable cache is attached; returns the rows sent."""
        if not self.due(step) or cache is None:
            return 0
        cursor = self._cursor
        if cursor is None or cursor.cache is not cache:
            cursor = self._cursor = RadixCursor(cache)
        if not cursor.walkable:
            if not self._told_unwalkable:
                logger.info("kv_canary sweep: %s holds no prefix tree; nothing to sweep", type(cache).__name__)
                self._told_unwalkable = True
            return 0
        piece = cursor.next_slice(self.capacity)
        if piece.rows == 0:
            return 0
        self.send(piece)
        self.ops.sweep(self.state, self.buffers)
        return piece.rows

    def send(self, piece: WalkSlice) -> None:
        """Stage ``piece``'s rows: host-known values through the pinned buffer in one copy, device-resident
        slots gathered on the device behind it."""
        import numpy as np
        import torch

        n = piece.rows
        if n > self.capacity:
            raise ValueError(f"kv canary sweep: a slice of {n} rows exceeds the {self.capacity}-row buffer")
        upload = self._upload
        host = upload.begin()
        host["count"][0] = n
        rows = host["rows"]
        slot_dst, prev_dst = host["slot_dst"], host["prev_dst"]
        device = self.buffers.rows.device
        # Tensors already on the rows' device are gathered there (no host read); anything else
        # (ints, lists, host tensors next to a CUDA pool) goes through the pinned buffer.
        on_device = lambda values: getattr(values, "device", None) == device  # noqa: E731
        device_slots, device_prevs, device_flat = [], [], []
        n_slot_dst = n_prev_dst = 0
        at = 0
        for seg in piece.segments:
            k = len(seg)
            if isinstance(seg, FlatRows):
                if on_device(seg.slots):
                    device_flat.append((at, seg))
                else:
                    rows[at : at + k, 0] = seg.slots.cpu().numpy()
                    rows[at : at + k, 1] = seg.positions.cpu().numpy()
                    rows[at : at + k, 2] = seg.prevs.cpu().numpy()
                at += k
                continue
            rows[at : at + k, 1] = np.arange(seg.start_position, seg.start_position + k)
            # The first row's predecessor, then the segment's own slots; prev_dst and device_prevs
            # are filled in the same order, so one gather puts every device value in its row.
            prev = seg.prev
            if on_device(prev):
                rows[at, 2] = UNKNOWN_PREV
                prev_dst[n_prev_dst] = at
                n_prev_dst += 1
                device_prevs.append(prev)
            else:
                rows[at, 2] = int(prev.reshape(-1)[0]) if hasattr(prev, "shape") else int(prev)
            if on_device(seg.slots):
                rows[at : at + k, 0] = 0
                slot_dst[n_slot_dst : n_slot_dst + k] = np.arange(at, at + k)
                n_slot_dst += k
                device_slots.append(seg.slots)
                if k > 1:
                    prev_dst[n_prev_dst : n_prev_dst + k - 1] = np.arange(at + 1, at + k)
                    n_prev_dst += k - 1
                    device_prevs.append(seg.slots[: k - 1])
            else:
                values = np.asarray(seg.slots.cpu() if hasattr(seg.slots, "cpu") else seg.slots, dtype=np.int64)
                rows[at : at + k, 0] = values
                rows[at + 1 : at + k, 2] = values[: k - 1]
            at += k
        gathers = n_slot_dst or n_prev_dst
        # The gather targets sit after the rows: sent only when a gather reads them.
        upload.send(upload.size if gathers else 1 + 3 * n)
        device_rows = self.buffers.rows
        if n_slot_dst:
            values = torch.cat([s.reshape(-1) for s in device_slots]).to(torch.int64)
            device_rows[:, 0].index_copy_(0, upload.device["slot_dst"][:n_slot_dst], values)
        if n_prev_dst:
            values = torch.cat([s.reshape(-1) for s in device_prevs]).to(torch.int64)
            device_rows[:, 2].index_copy_(0, upload.device["prev_dst"][:n_prev_dst], values)
        for at, seg in device_flat:
            k = len(seg)
            for col, values in enumerate((seg.slots, seg.positions, seg.prevs)):
                device_rows[at : at + k, col].copy_(values)
        self._rows_sent += n
