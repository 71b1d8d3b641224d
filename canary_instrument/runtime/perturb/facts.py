"""What an injection touched, read back from the device without waiting for it.

A perturbation picks its target on the host but reaches it through device tensors (the batch's
req-pool indices, ``req_to_token`` entries, cached slots sglang keeps on the device), so the slot
and request it hit are device values. Each injection copies them into a row of a pinned host
ring with one non-blocking copy and records an event; its log line is written once the event
has completed, at a later hook (normally the next one) or at ``drain``. The main stream never
waits for the host.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

WIDTH = 12  # device facts per injection


class FactReadback:
    def __init__(self, device: Any, capacity: int = 64):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.capacity = capacity
        self._device_rows = torch.zeros((capacity, WIDTH), dtype=torch.int64, device=self.device)
        self._host_rows = torch.zeros((capacity, WIDTH), dtype=torch.int64, pin_memory=self.cuda)
        self._events = [torch.cuda.Event() if self.cuda else None for _ in range(capacity)]
        self._pending: deque = deque()  # (row, names, done), oldest first
        self._next = 0

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.capacity

    def submit(self, values: dict[str, Any], done: Callable[[dict[str, int]], None]) -> None:
        """Copy ``values`` (one-element device tensors) to the host; call ``done`` with them as ints later."""
        import torch

        if self.full:
            raise RuntimeError("kv canary perturb: too many injections waiting for their device facts")
        if len(values) > WIDTH:
            raise ValueError(f"kv canary perturb: at most {WIDTH} device facts per injection; got {len(values)}")
        row = self._next
        self._next = (row + 1) % self.capacity
        names = list(values)
        if names:
            facts = torch.cat([v.reshape(-1)[:1].to(torch.int64) for v in values.values()])
            self._device_rows[row, : len(names)].copy_(facts)
            self._host_rows[row, : len(names)].copy_(self._device_rows[row, : len(names)], non_blocking=self.cuda)
            if self.cuda:
                self._events[row].record()
        self._pending.append((row, names, done))

    def poll(self, wait: bool = False) -> int:
        """Deliver every injection whose facts have arrived (all of them with ``wait``); returns how many."""
        delivered = 0
        while self._pending:
            row, names, done = self._pending[0]
            event = self._events[row] if names else None
            if event is not None:
                if not wait and not event.query():
                    break
                event.synchronize()
            self._pending.popleft()
            values = self._host_rows[row, : len(names)].tolist()
            done(dict(zip(names, values)))
            delivered += 1
        return delivered
