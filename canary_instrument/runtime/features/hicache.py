"""Canary rows that follow KV through sglang's hierarchical cache (HiCache): a sidecar beside each host pool.

HiCache backs a cached prefix's device KV up to a host pool and later loads it back into other device
slots. The canary rows of those slots must travel with it, or every load-back reads rows that belong to
whoever held the new slots before (false violations), and a load to the wrong slots or a corrupted host
copy looks the same as a clean load. So the host pool's backup and load are wrapped on the instance: each
copies the rows of the transferred slots to or from a sidecar indexed by host slot, with the same host and
device indices as the KV copy and on the same (the transfer's) stream, so the next read of the loaded
slots verifies them like any others.

The host pool is found by structure under the prefix cache the scheduler attaches (``attach_radix_cache``):
an object holding host KV (``kv_buffer``) with a backup method and a per-layer load method that take the
device pool, host indices and device indices. Method names only rank candidates. HiCache's third tier
(storage) is refused: see ``STORAGE_REFUSAL``.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Optional

from canary_instrument.runtime.features.hicache_find import (  # noqa: F401 - the finding half, re-exported
    _TRANSFER_PARAMS,
    BACKUP_NAMES,
    LOAD_NAMES,
    HostTransfer,
    controllers,
    find_host_pools,
    host_transfers,
)
from canary_instrument.runtime.setup.instance_wrap import remember, unbind, wrap_call
from canary_instrument.runtime.passes.state import GROUP_FULL

logger = logging.getLogger("canary_instrument.runtime")

_MARK = "__kv_canary_hicache__"

STORAGE_REFUSAL = (
    "HiCache's storage tier moves pages between the host pool and a storage backend by the host pool's own "
    "buffer addresses (HiCacheStorage.batch_set_v1 / batch_get_v1 with host_indices, zero-copy page "
    "metadata from get_page_buffer_meta); that interface has no per-page place for canary rows, so a page "
    "prefetched from storage would reach the device without them. Run HiCache without "
    "--hicache-storage-backend, or the canary off"
)


class UnsupportedHiCacheError(ValueError):
    """A HiCache set-up the canary cannot follow; the message names what is missing."""


# Device KV pool (by id) -> (weak pool, weak manager): the canary that guards it. A backup or load names its
# device pool, so the wrapper finds the rows to copy (the target's and an EAGLE draft's pool each have theirs).
_GUARDED: dict[int, tuple] = {}


def register_kv_pool(pool: Any, manager: Any) -> None:
    """Note that ``manager``'s canary rows guard ``pool`` (install_canary calls this)."""
    for key in [key for key, (owner, guard) in _GUARDED.items() if owner() is None or guard() is None]:
        del _GUARDED[key]  # engines gone (tests and benchmarks build many in one process)
    pools = [pool]
    # Sub-pools a host pool may name as its device pool (an SWA pool's are registered to be refused).
    for attr in ("full_kv_pool", "swa_kv_pool"):
        inner = getattr(pool, attr, None)
        if inner is not None and inner is not pool:
            pools.append(inner)
    for each in pools:
        _GUARDED[id(each)] = (hold_weakly(each), weakref.ref(manager))


def hold_weakly(obj: Any) -> Callable[[], Any]:
    """A call that gives ``obj`` back: a weak reference where the class allows one."""
    try:
        return weakref.ref(obj)
    except TypeError:  # a class with __slots__ and no __weakref__: held for the process's life
        return lambda: obj


def guarding(pool: Any) -> Optional[Any]:
    """The manager whose rows guard device pool ``pool``, or None."""
    entry = _GUARDED.get(id(pool)) if pool is not None else None
    if entry is None or entry[0]() is not pool:
        return None
    return entry[1]()


class HostSidecar:
    """Canary rows of one host pool, one row per host slot, copied beside its KV.

    Kept on the canary rows' device: the copies are then device index ops enqueued on the transfer's
    stream, with no host synchronisation (a pinned host table would need a kernel that scatters through
    mapped memory). Per host slot it costs 32 bytes per canary group and half, plus 8 bytes per layer
    beyond the first that real-KV fingerprints cover.
    """

    def __init__(self, host_pool: Any, manager: Any):
        import torch

        from canary_instrument.runtime.passes.layers import fingerprint_table, layer_count

        state = manager.state
        slots = max(int(getattr(host_pool, "size", 0)), int(getattr(host_pool, "logical_size", 0) or 0))
        self._manager = weakref.ref(manager)  # the wrappers live on the engine's host pool: no cycle back
        self.groups = list(state.groups)
        self.device = self.groups[0].rows.device
        self.rows = [torch.zeros((slots, 4), dtype=torch.int64, device=self.device) for _ in self.groups]
        self.fingerprints = []
        for group in self.groups:
            wide = state.realkv != "none" and layer_count(group) > 1
            table = fingerprint_table(group) if wide else None
            self.fingerprints.append(
                torch.zeros((slots, table.shape[1]), dtype=torch.int64, device=self.device) if wide else None
            )

    def _indices(self, host_indices: Any, device_indices: Any) -> tuple[Any, Any]:
        return _on(host_indices, self.device), _on(device_indices, self.device)

    def backup(self, host_indices: Any, device_indices: Any) -> None:
        from canary_instrument.runtime.passes.layers import fingerprint_table

        host, dev = self._indices(host_indices, device_indices)
        for group, rows, fps in zip(self.groups, self.rows, self.fingerprints):
            rows.index_copy_(0, host, group.rows.index_select(0, dev))
            if fps is not None:
                fps.index_copy_(0, host, fingerprint_table(group).index_select(0, dev))

    def load(self, host_indices: Any, device_indices: Any) -> None:
        from canary_instrument.runtime.passes.layers import fingerprint_table

        _apply_pending_frees(self._manager())
        host, dev = self._indices(host_indices, device_indices)
        for group, rows, fps in zip(self.groups, self.rows, self.fingerprints):
            group.rows.index_copy_(0, dev, rows.index_select(0, host))
            if fps is not None:
                fingerprint_table(group).index_copy_(0, dev, fps.index_select(0, host))


def _on(indices: Any, device: Any) -> Any:
    """``indices`` as int64 on ``device`` without a host sync (pageable host tensors go through pinned memory)."""
    import torch

    indices, device = indices.reshape(-1), torch.device(device)
    if indices.device == device:
        return indices.to(torch.int64)
    if indices.device.type == "cpu" and device.type == "cuda":
        indices = indices.to(torch.int64).pin_memory()
        return indices.to(device, non_blocking=True)
    return indices.to(device=device, dtype=torch.int64, non_blocking=True)


def _apply_pending_frees(manager: Any) -> None:
    """Mark the slots freed since the last forward now, on the load's stream, before the rows land.

    The allocator's frees are otherwise marked at the next forward site, on the forward's stream: a load
    into a slot freed since then would have its loaded rows overwritten by that mark (HiCache evicts and
    loads back in one scheduling step). Enqueued here, the mark precedes the load's rows in stream order.
    """
    side = getattr(manager, "request_side", None) if manager is not None else None
    if side is None:
        return
    if side.offset:  # the frees in the device buffer (request_side.py): marked and emptied here instead
        manager.ops.mark_freed(manager.state)
        side.offset = 0
    if not side.freed:
        return
    import torch

    from canary_instrument.runtime.checks.request_side import mark_freed

    freed, side.freed = side.freed, []
    if freed[0].is_cuda:
        # Made on the forward's stream, read on the load's: kept from reuse until the load's work is done.
        for slots in freed:
            slots.record_stream(torch.cuda.current_stream(slots.device))
    mark_freed(manager.state, freed[0] if len(freed) == 1 else torch.cat(freed))


def unwrap(host_pool: Any) -> None:
    """Undo ``attach_hicache`` on one host pool (tests, and engines that rebuild their cache)."""
    for name in BACKUP_NAMES + LOAD_NAMES:
        value = host_pool.__dict__.get(name)
        if value is not None and getattr(value, _MARK, False):
            del host_pool.__dict__[name]
    host_pool.__dict__.pop("kv_canary_sidecars", None)


def attach_host_pool(host_pool: Any) -> list:
    """Wrap one host pool's backup and load so the canary rows of every guarded device pool it serves follow
    its KV; returns the sidecars made (one per canary that guards a device pool this host pool names)."""
    transfers = host_transfers(host_pool)
    if transfers is None:
        raise UnsupportedHiCacheError(
            f"kv canary: {type(host_pool).__qualname__} is not a host KV pool (kv_buffer, and backup and "
            f"per-layer load methods taking {', '.join(_TRANSFER_PARAMS)})"
        )
    _refuse_unfollowable(host_pool)
    backup, load = transfers
    sidecars: dict[int, HostSidecar] = {}
    pool_ref = hold_weakly(host_pool)  # the wrappers are kept on the host pool: no cycle through them

    def sidecar(device_pool: Any) -> Optional[HostSidecar]:
        manager = guarding(device_pool)
        if manager is None:
            return None
        found = sidecars.get(id(manager))
        if found is None:
            _refuse_device_pool(device_pool)
            found = sidecars[id(manager)] = HostSidecar(pool_ref(), manager)
        return found

    def cars(transfer: HostTransfer, args: tuple, kwargs: dict) -> list:
        device_pool = transfer.argument(args, kwargs, "device_pool")
        pools, owner = [device_pool], pool_ref()
        if device_pool is getattr(owner, "device_pool", None):
            # Draft (MTP) layers packed into this host pool move in the target's call, with the same slot ids.
            pools += list(getattr(owner, "mtp_draft_device_pools", ()))
        return [car for car in map(sidecar, pools) if car is not None]

    def after_backup(args: tuple, kwargs: dict, result: Any) -> Any:
        for car in cars(backup, args, kwargs):
            car.backup(backup.argument(args, kwargs, "host_indices"), backup.argument(args, kwargs, "device_indices"))
        return result

    def after_load(args: tuple, kwargs: dict, result: Any) -> Any:
        # Every layer's load moves the same slots: the rows follow once, with the first layer's copy.
        if load.argument(args, kwargs, "layer_id") == 0:
            for car in cars(load, args, kwargs):
                car.load(load.argument(args, kwargs, "host_indices"), load.argument(args, kwargs, "device_indices"))
        return result

    # Made up front for the device pools the host pool names, so the sidecar exists before the first backup.
    for device_pool in (getattr(host_pool, "device_pool", None), *getattr(host_pool, "mtp_draft_device_pools", ())):
        sidecar(device_pool)
    wrap_call(host_pool, backup.name, after_backup, _MARK)
    wrap_call(host_pool, load.name, after_load, _MARK)
    host_pool.__dict__["kv_canary_sidecars"] = sidecars
    return list(sidecars.values())


def _refuse_if_set(obj: Any, attribute: str, message: str) -> None:
    """Refuse ``obj`` when it sets ``attribute``: ``message`` names its class at ``{name}``."""
    if getattr(obj, attribute, None) is not None:
        raise UnsupportedHiCacheError(message.format(name=type(obj).__qualname__))


def _refuse_unfollowable(host_pool: Any) -> None:
    _refuse_if_set(host_pool, "shared_allocation_domain",
                   "kv canary: host pool {name} shares a compacting allocation domain (shared_allocation_domain): "
                   "its host rows move without a backup or load, so a sidecar indexed by host slot would go stale")


def _refuse_device_pool(device_pool: Any) -> None:
    name = type(device_pool).__qualname__
    _refuse_if_set(device_pool, "host_transfer_translate",
                   "kv canary: device pool {name} translates slot ids to buffer rows for host transfers "
                   "(host_transfer_translate), so the indices a backup or load sees are not canary row ids")
    manager = guarding(device_pool)
    if manager is not None and any(g.group != GROUP_FULL for g in manager.state.groups):
        raise UnsupportedHiCacheError(
            f"kv canary: HiCache of the SWA pool {name}: its sliding-window KV moves through side-pool "
            "transfers with their own indices; the canary follows full-attention KV only"
        )


def attach_hicache(manager: Any, tree_cache: Any) -> list:
    """Follow HiCache's host tier under ``tree_cache`` (nothing when it has none); refuse its storage tier.

    Returns the host pools wrapped."""
    pools, found = find_host_pools(tree_cache), controllers(tree_cache)
    if found and not pools:
        raise UnsupportedHiCacheError(
            f"kv canary: HiCache is on ({type(found[0]).__qualname__} holds mem_pool_host "
            f"{type(found[0].mem_pool_host).__qualname__}) but no host pool under it holds kv_buffer with a backup "
            f"and a per-layer load taking {', '.join(_TRANSFER_PARAMS)}; the canary rows could not follow its KV"
        )
    if not pools:
        return []
    for owner in (tree_cache, *found):
        if getattr(owner, "enable_storage", False) or getattr(owner, "storage_backend", None) is not None:
            raise UnsupportedHiCacheError(f"kv canary: {STORAGE_REFUSAL}")
    for controller in found:
        _refuse_later_storage(controller)
    for host_pool in pools:
        attach_host_pool(host_pool)
    logger.info(
        "kv canary: HiCache host tier followed: %s",
        ", ".join(f"{type(p).__qualname__} ({int(getattr(p, 'size', 0))} host slots)" for p in pools),
    )
    return pools


def _refuse_later_storage(controller: Any) -> None:
    """A storage backend attached at run time (sglang's admin call) is refused the same way."""
    original, owner = unbind(controller, "attach_storage_backend")
    if original is None or getattr(original, _MARK, False):
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedHiCacheError(f"kv canary: {STORAGE_REFUSAL}")

    setattr(refuse, _MARK, True)
    remember(refuse, original, owner)
    setattr(controller, "attach_storage_backend", refuse)
