"""Faults in HiCache's host tier, injected into a host pool's own transfers to prove the sidecar catches them.

- ``hicache_host_copy``: a backup lands, then one bit of the first byte of one backed-up host slot's K
  (MLA: its latent KV) flips in every layer, as a host-memory or transfer bug would leave it. The rows travel
  intact, so the next read after the load reports ``fingerprint`` (needs real-KV ``partial`` or ``all``:
  nothing else looks at KV bytes).
- ``hicache_load_slots``: a load moves the host KV to the device indices rotated by one, while the prefix
  cache keeps the indices the load was given (an index bug in a transfer). The rows go with the KV, so
  the slots the cache names hold a neighbour's rows or none: the next read reports ``position``/``link``
  (or ``freed`` where a slot was just freed).

Each kind wraps the host pool's wrapped transfer method on the instance, outside the canary's own
wrapper, so both the KV copy and the rows see the fault, and draws from its own seeded generator. They
act on the host pool, not at the forward sites the ``kv_canary_perturb`` kinds hook, so they are
switched on by ``inject_hicache_fault`` (the tests and the demo call it), not by the rate settings.
"""

from __future__ import annotations

import inspect
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from canary_instrument.runtime.features.hicache import hold_weakly, host_transfers
from canary_instrument.runtime.setup.instance_wrap import remember, unbind

logger = logging.getLogger("canary_instrument.runtime")

_MARK = "__kv_canary_hicache_fault__"


@dataclass
class HiCacheFault:
    """One switched-on fault: what it wrapped and what it did (``injections``: one dict per hit)."""

    kind: str
    pool_ref: Any  # a weak reference: the fault's wrapper lives on the host pool (no cycle through it)
    rate: float
    rng: random.Random
    transfer: Any  # the HostTransfer it wraps
    injections: list = field(default_factory=list)
    _replaced: dict = field(default_factory=dict)  # method name -> what the instance held before (None: nothing)

    @property
    def host_pool(self) -> Any:
        return self.pool_ref()

    def remove(self) -> None:
        """Put back what the fault wrapped (the canary's wrapper, or the engine's own method)."""
        for name, before in self._replaced.items():
            if before is None:
                self.host_pool.__dict__.pop(name, None)
            else:
                self.host_pool.__dict__[name] = before
        self._replaced.clear()


class HostCopyFlip:
    name = "hicache_host_copy"
    hook = "backup"

    def around(self, fault: HiCacheFault, inner: Callable) -> Callable:
        import torch

        def call(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            host_indices = fault.transfer.argument(args, kwargs, "host_indices").reshape(-1)
            if host_indices.numel() and fault.rng.random() < fault.rate:
                if torch.cuda.is_available():
                    # The backup's copy into host memory is in flight on this stream: flip after it lands.
                    torch.cuda.current_stream().synchronize()
                pick = fault.rng.randrange(host_indices.numel())
                rows = _host_rows(fault.host_pool)
                slot = host_indices[pick:pick + 1].to(device=rows.device, dtype=torch.int64)
                hit = rows.index_select(0, slot)  # a copy: [1, layers, ...] bytes
                hit.view(1, hit.shape[1], -1)[:, :, 0] ^= 1  # the first byte of every layer
                rows.index_copy_(0, slot, hit)
                fault.injections.append({"kind": self.name, "host_slot": slot, "index": pick})
                logger.info("kv canary hicache fault: kind=%s index=%d of %d backed-up slots", self.name, pick,
                            host_indices.numel())
            return result

        return call


class LoadSlotsRotated:
    name = "hicache_load_slots"
    hook = "load"

    def around(self, fault: HiCacheFault, inner: Callable) -> Callable:
        load = fault.transfer
        drawn = [False]  # this load's draw, made at its first layer and kept for the others

        def call(*args: Any, **kwargs: Any) -> Any:
            layer = load.argument(args, kwargs, "layer_id")
            if layer == 0:
                drawn[0] = fault.rng.random() < fault.rate
            device_indices = load.argument(args, kwargs, "device_indices")
            if drawn[0] and device_indices is not None and device_indices.numel() > 1:
                moved = device_indices.roll(1)
                position = load.positions["device_indices"]
                if position < len(args):
                    args = args[:position] + (moved,) + args[position + 1:]
                else:
                    kwargs = {**kwargs, "device_indices": moved}
                if layer == 0:
                    fault.injections.append({"kind": self.name, "device_slots": device_indices, "moved_to": moved})
                    logger.info("kv canary hicache fault: kind=%s %d loaded slots rotated by one", self.name,
                                device_indices.numel())
            return inner(*args, **kwargs)

        return call


KINDS = {kind.name: kind for kind in (HostCopyFlip(), LoadSlotsRotated())}
HICACHE_KINDS = tuple(KINDS)


def _host_rows(host_pool: Any) -> Any:
    """The host buffer of the K half (MLA: the latent KV) as bytes, host slot first: [host slots, layers, ...]."""
    import torch

    buffer = getattr(host_pool, "k_buffer", None)
    if buffer is None:
        buffer = host_pool.kv_buffer
    layout = getattr(host_pool, "layout", "layer_first")
    if layout == "layer_first":
        buffer = buffer.transpose(0, 1)
    elif layout not in ("page_first", "page_first_direct"):
        raise ValueError(f"kv canary: hicache_host_copy does not know the host layout {layout!r}")
    return buffer.view(torch.uint8)


def inject_hicache_fault(host_pool: Any, kind: str, *, rate: float = 1.0, seed: int = 0) -> HiCacheFault:
    """Switch fault ``kind`` on for ``host_pool``'s transfers, each at probability ``rate``."""
    if kind not in KINDS:
        raise ValueError(f"kv canary: unknown HiCache fault {kind!r}; known: {', '.join(HICACHE_KINDS)}")
    transfers = host_transfers(host_pool)
    if transfers is None:
        raise ValueError(f"kv canary: {type(host_pool).__qualname__} is not a HiCache host pool")
    spec = KINDS[kind]
    transfer = transfers[0] if spec.hook == "backup" else transfers[1]
    rng = random.Random(seed * len(HICACHE_KINDS) + HICACHE_KINDS.index(kind))
    fault = HiCacheFault(kind, hold_weakly(host_pool), rate, rng, transfer)
    name = transfer.name
    fault._replaced.setdefault(name, host_pool.__dict__.get(name))
    original, owner = unbind(host_pool, name)
    signature = inspect.signature(getattr(host_pool, name))
    # Through a weak reference to the pool, as the canary's own wrappers (no instance -> wrapper -> instance cycle).
    call = spec.around(fault, original if owner is None else (lambda *a, **k: original(owner(), *a, **k)))
    call.__signature__ = signature
    setattr(call, _MARK, fault)
    remember(call, original, owner)
    setattr(host_pool, name, call)
    return fault
