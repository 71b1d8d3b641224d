"""Finding HiCache's host pools by structure: an object holding host KV (``kv_buffer``) with a backup and a
per-layer load method that take the device pool, host indices and device indices (``hicache.py`` follows them).
Method names only rank candidates."""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass
from typing import Any, Optional

# Backup (device -> host, all layers) and per-layer load (host -> device), by rank: the entry point the
# transfer engine calls first (releases with a physical-index layer call the plain method from it, so only
# one of each pair is wrapped: wrapping both would copy the rows twice).
BACKUP_NAMES = ("backup_from_device_all_layer_physical", "backup_from_device_all_layer")
LOAD_NAMES = ("load_to_device_per_layer_physical", "load_to_device_per_layer")
_TRANSFER_PARAMS = ("device_pool", "host_indices", "device_indices")


@dataclass
class HostTransfer:
    """One wrapped transfer method: where its device pool, indices and layer sit among the arguments."""

    name: str
    positions: dict  # parameter name -> positional index (self excluded)
    per_layer: bool

    def argument(self, args: tuple, kwargs: dict, name: str) -> Any:
        index = self.positions[name]
        return args[index] if index < len(args) else kwargs.get(name)


def _transfer_shape(obj: Any, name: str, per_layer: bool) -> Optional[HostTransfer]:
    method = getattr(obj, name, None)
    if not callable(method):
        return None
    try:
        params = [p.name for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    needed = _TRANSFER_PARAMS + (("layer_id",) if per_layer else ())
    if not all(p in params for p in needed):
        return None
    if not per_layer and "layer_id" in params:
        return None
    return HostTransfer(name, {p: params.index(p) for p in needed}, per_layer)


def host_transfers(obj: Any) -> Optional[tuple[HostTransfer, HostTransfer]]:
    """(backup, load) of a host pool: holds host KV and moves it with host and device indices; else None."""
    if getattr(obj, "kv_buffer", None) is None:
        return None
    backup = next((t for t in (_transfer_shape(obj, n, False) for n in BACKUP_NAMES) if t), None)
    load = next((t for t in (_transfer_shape(obj, n, True) for n in LOAD_NAMES) if t), None)
    return (backup, load) if backup and load else None


# Values the walk neither inspects nor enters: scalars, and classes and modules (engine objects reference
# module-level namespaces, such as torch's op registries, whose attribute lookups have side effects).
_NOT_WALKED = (str, bytes, int, float, bool, type, types.ModuleType)


def _is_host_pool(obj: Any) -> bool:
    try:
        return host_transfers(obj) is not None
    except Exception:  # an attribute lookup that raises: whatever it is, it is no host pool
        return False


def find_host_pools(tree_cache: Any) -> list:
    """Host pools reachable from the prefix cache through attributes and lists (the cache controller's host
    pool, a host pool group's entries), host-named attributes first; each pool once."""
    # Breadth first, without a recursive closure (one would be a reference cycle holding what it found).
    found, seen, level = [], set(), [tree_cache]
    for depth in range(5):
        below = []
        for obj in level:
            if obj is None or id(obj) in seen or isinstance(obj, _NOT_WALKED):
                continue
            seen.add(id(obj))
            if _is_host_pool(obj):
                found.append(obj)
                continue
            members = getattr(obj, "__dict__", None)
            if depth == 4 or not isinstance(members, dict):
                continue
            for _, value in sorted(members.items(), key=lambda item: ("host" not in item[0], item[0])):
                below.extend(value if isinstance(value, (list, tuple)) else (value,))
        level = below
    return found


def controllers(tree_cache: Any) -> list:
    """HiCache's cache controllers under the prefix cache: the objects that hold its host pool
    (``mem_pool_host``), the cache itself included."""
    members = getattr(tree_cache, "__dict__", {})
    return [obj for obj in (tree_cache, *members.values()) if getattr(obj, "mem_pool_host", None) is not None]
