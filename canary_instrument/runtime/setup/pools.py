"""Attach canary rows to a KV pool, recognised by structure (MHA, MLA, SWA), never by class name.

A pool is judged by what it holds: per-layer buffer lists (``k_buffer``/``v_buffer`` or
``kv_buffer``), sub-pools (``full_kv_pool``, ``swa_kv_pool``), the slot geometry that its
``size``/``page_size`` promise, and how its rows are addressed. Anything the canary cannot
guard completely is refused at install with the class, the reason and what is supported: a
silent skip would leave the cache unguarded, and a guess would report false violations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.passes.layers import attach_layers
from canary_instrument.runtime.passes.state import GROUP_FULL, GROUP_SWA, HALF_K, HALF_V, CanaryGroup

_BYTES_FOR_PARTIAL = 16

SUPPORTED = (
    "supported: an MHA pool (per-layer k_buffer and v_buffer lists), an MLA pool (per-layer kv_buffer list), "
    "a wrapper whose paged KV is one such pool in full_kv_pool, or an SWA pool (full_kv_pool and swa_kv_pool, "
    "both MHA, with a full_to_swa_index_mapping on the pool or its allocator); each with one buffer row per "
    "slot (or per page) addressed by the slot ids in req_to_token"
)


class UnsupportedPoolError(ValueError):
    """The KV pool's structure is one the canary cannot guard; the message says why and what is supported."""


@dataclass
class AttachedPool:
    layout: str  # "mha" | "mla" | "swa"
    groups: list[CanaryGroup]
    swa_mapping: Optional[Any] = None
    swa_window: int = 0
    description: str = ""  # what is guarded, for the install log line


@dataclass(frozen=True)
class _Halves:
    """One pool's guarded buffers: layout ("mha" | "mla"), the (attr, half) pairs, slot geometry."""

    pool: Any
    layout: str
    attrs: tuple  # ((attr, half), ...)
    slots: int  # canary rows: one per slot id, padding slot 0 included
    slots_per_row: int  # 1 = token-major buffer rows, page_size = page-major rows
    like: Optional["_Halves"] = None  # set for a half with no layers (_layerless): the half its words are shaped as

    @property
    def holds_kv(self) -> bool:
        return self.like is None


def _name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _refuse(pool: Any, reason: str) -> UnsupportedPoolError:
    return UnsupportedPoolError(f"kv canary: unsupported KV pool {_name(pool)}: {reason}; {SUPPORTED}")


def attach_pool(pool: Any, *, real_kv: str, window: Optional[int], allocator: Any = None) -> AttachedPool:
    """Allocate zeroed canary rows beside ``pool`` (one int64[4] row per slot and half).

    ``allocator`` is the engine's token allocator: sglang keeps the SWA slot mapping there and
    registers it on the pool, so either place is accepted.
    """
    if _sub_pool(pool, "swa_kv_pool") is not None:
        return _attach_swa(pool, real_kv=real_kv, window=window, allocator=allocator)
    halves = _halves(pool, pool)
    groups = _groups(halves, GROUP_FULL, real_kv)
    return AttachedPool(halves.layout, groups, description=_describe(pool, halves))


def _attach_swa(pool: Any, *, real_kv: str, window: Optional[int], allocator: Any) -> AttachedPool:
    ring = getattr(pool, "swa_req_ring_size", None)
    if ring is not None:
        raise _refuse(
            pool,
            f"its SWA KV is a per-request ring of {ring} tokens addressed by req_pool_idx (swa_req_ring_size), "
            "not slots reached through full_to_swa_index_mapping",
        )
    full = _sub_pool(pool, "full_kv_pool")
    if full is None:
        raise _refuse(pool, "it has swa_kv_pool but no full_kv_pool")
    swa = _halves(pool, pool.swa_kv_pool)
    # A model whose every layer is a sliding-window one (a multi-layer EAGLE draft's MTP layer) leaves the full
    # sub-pool without layers; its slots are still the ones req_to_token names, so their rows are kept.
    subs = {"full_kv_pool": _layerless(pool, full, swa) if _has_no_layers(full) else _halves(pool, full),
            "swa_kv_pool": swa}
    for attr, sub in subs.items():
        if sub.layout != "mha":
            raise _refuse(
                pool,
                f"its {attr} {type(sub.pool).__qualname__} is an {sub.layout.upper()} pool; the SWA canary "
                "layout guards MHA sub-pools (K and V) only",
            )
    mapping = _swa_mapping(pool, allocator)
    if window is None or int(window) <= 0:
        raise ValueError(
            f"kv canary: SWA pool {type(pool).__qualname__} needs model_runner.sliding_window_size > 0; got {window!r}"
        )
    groups = _groups(subs["full_kv_pool"], GROUP_FULL, real_kv) + _groups(subs["swa_kv_pool"], GROUP_SWA, real_kv)
    description = (
        f"{_name(pool)} (swa: full {_describe(subs['full_kv_pool'].pool, subs['full_kv_pool'])}; "
        f"swa {_describe(subs['swa_kv_pool'].pool, subs['swa_kv_pool'])}; window {int(window)})"
    )
    return AttachedPool("swa", groups, swa_mapping=mapping, swa_window=int(window), description=description)


def _has_no_layers(pool: Any) -> bool:
    """Both per-layer lists there and empty: a sub-pool of a model none of whose layers it serves."""
    halves = [getattr(pool, attr, None) for attr in ("k_buffer", "v_buffer")]
    return all(isinstance(h, (list, tuple)) and len(h) == 0 for h in halves)


def _layerless(top: Any, pool: Any, like: _Halves) -> _Halves:
    """The full half of an SWA pool whose full sub-pool has no layers: as many slots as it promises (size +
    page_size), its real-KV words shaped as ``like``'s (the SWA half's) and read from one zero row."""
    size, page = getattr(pool, "size", None), getattr(pool, "page_size", None)
    if not (isinstance(size, int) and isinstance(page, int) and page >= 1):
        raise _refuse(top, f"its full_kv_pool {type(pool).__qualname__} has no layers and no size and page_size")
    return _Halves(pool, "mha", like.attrs, size + page, 1, like=like)


def _swa_mapping(pool: Any, allocator: Any) -> Any:
    import torch

    for owner in (pool, allocator):
        mapping = getattr(owner, "full_to_swa_index_mapping", None) if owner is not None else None
        if isinstance(mapping, torch.Tensor):
            if mapping.dim() != 1 or mapping.dtype not in (torch.int32, torch.int64):
                raise _refuse(
                    pool,
                    f"full_to_swa_index_mapping of {type(owner).__qualname__} is {mapping.dtype} "
                    f"{tuple(mapping.shape)}, expected a 1-D integer tensor",
                )
            return mapping
    raise _refuse(
        pool,
        "no full_to_swa_index_mapping tensor on the pool or on model_runner.token_to_kv_pool_allocator "
        "(install_canary must run after the SWA allocator exists)",
    )


def _sub_pool(pool: Any, attr: str) -> Any:
    return getattr(pool, attr, None)


def _halves(top: Any, pool: Any) -> _Halves:
    """The buffers of one non-SWA pool, or the refusal that says why it cannot be guarded."""
    if _layers(pool, "kv_buffer") is not None:
        found = _Halves(pool, "mla", (("kv_buffer", HALF_K),), 0, 1)
    elif _layers(pool, "k_buffer") is not None and _layers(pool, "v_buffer") is not None:
        found = _Halves(pool, "mha", (("k_buffer", HALF_K), ("v_buffer", HALF_V)), 0, 1)
    else:
        wrapped = _sub_pool(pool, "full_kv_pool")
        if wrapped is not None and wrapped is not pool and pool is top:
            # A pool whose paged (per-slot) KV lives in one sub-pool, beside per-request state.
            return _halves(top, wrapped)
        raise _refuse(top, _what_is_missing(pool, top))
    if callable(getattr(pool, "register_mapping", None)):
        # Outside the SWA pair, a pool that takes an index mapping from its allocator keeps a device
        # subset of a larger slot space: the slot ids in req_to_token are not its rows.
        raise _refuse(
            top,
            f"{'it' if pool is top else type(pool).__qualname__} writes a slot's KV to the row an index mapping "
            "registered by its allocator names (register_mapping), so the slot ids in req_to_token are not its rows",
        )
    slots, per_row = _slot_geometry(top, found)
    return _Halves(pool, found.layout, found.attrs, slots, per_row)


def _what_is_missing(pool: Any, top: Any) -> str:
    where = "it" if pool is top else f"its sub-pool {type(pool).__qualname__}"
    for attr in ("kv_buffer", "k_buffer", "v_buffer"):
        value = getattr(pool, attr, None)
        if value is not None and not isinstance(value, (list, tuple)):
            return (
                f"{where} holds {attr} as one {type(value).__name__}, not a per-layer list (a host/offload pool "
                "keeps KV for transfers; the canary guards the device pool the model reads)"
            )
        if isinstance(value, (list, tuple)) and len(value) == 0:
            return f"{where} has an empty {attr} list (a pool with no layers holds no KV to guard)"
    if _layers(pool, "k_buffer") is not None:
        return f"{where} has a k_buffer list but no v_buffer list (a K-only pool)"
    return f"{where} has no per-layer KV buffer list (k_buffer and v_buffer, or kv_buffer) and no full_kv_pool"


def _slot_geometry(top: Any, found: _Halves) -> tuple[int, int]:
    """(canary rows, slots per buffer row) from the pool's promise (size + page_size slots) and its buffers."""
    pool = found.pool
    attr = found.attrs[0][0]
    index, layer0 = _first_layer(pool, attr)
    where = f"{type(pool).__qualname__}.{attr}[{index}]"
    blocks = getattr(pool, "kernel_page_blocks", 1)
    if isinstance(blocks, int) and blocks > 1:
        raise _refuse(
            top,
            f"rows of {where} are addressed by translated kernel ids (kernel_page_blocks={blocks}), not by the "
            "slot ids in req_to_token",
        )
    rows = int(layer0.shape[0])
    size, page = getattr(pool, "size", None), getattr(pool, "page_size", None)
    if not (isinstance(size, int) and isinstance(page, int) and page >= 1):
        return rows, 1  # no promise to check against: one row per slot, as in the reference engine
    slots = size + page
    if rows >= slots:
        return rows, 1
    if page > 1 and rows * page == slots:
        return slots, page  # page-major: one buffer row holds a page of slots
    raise _refuse(
        top,
        f"{where} has {rows} rows for {slots} slots (size {size} + page_size {page}): the pool stores no KV "
        "row per slot",
    )


def _first_layer(pool: Any, attr: str) -> tuple[int, Any]:
    """The first layer that holds rows: a layer-sharded pool keeps empty placeholders for layers it does not own."""
    layers = _layers(pool, attr)
    for index, layer in enumerate(layers):
        if layer.shape[0] > 0:
            return index, layer
    return 0, layers[0]


def _describe(pool: Any, halves: _Halves) -> str:
    attrs = ", ".join(a for a, _ in halves.attrs)
    if not halves.holds_kv:
        return f"{_name(pool)} (no layers: {halves.slots} slots' rows kept, no real KV to read)"
    _, layer0 = _first_layer(halves.pool, halves.attrs[0][0])
    inner = "" if halves.pool is pool else f" via full_kv_pool {type(halves.pool).__qualname__}"
    rows = "page-major rows" if halves.slots_per_row > 1 else "one row per slot"
    return (
        f"{_name(pool)}{inner} ({halves.layout}: {attrs}; {len(_layers(halves.pool, halves.attrs[0][0]))} layers; "
        f"{halves.slots} slots, {rows}; {layer0.dtype})"
    )


def _layers(pool: Any, attr: str) -> Optional[list]:
    layers = getattr(pool, attr, None)
    if isinstance(layers, (list, tuple)) and len(layers) > 0:
        return list(layers)
    return None


def _groups(halves: _Halves, group: int, real_kv: str) -> list[CanaryGroup]:
    import torch

    out = []
    for attr, half in halves.attrs:
        if not halves.holds_kv:
            out.append(_layerless_group(halves, attr, group, half, real_kv))
            continue
        _, layer0 = _first_layer(halves.pool, attr)
        rows = torch.zeros((halves.slots, 4), dtype=torch.int64, device=layer0.device)
        found = CanaryGroup(group=group, half=half, rows=rows)
        if real_kv != "none":
            # Every layer this rank holds (a layer-sharded pool keeps empty placeholders for the others).
            owned = [(i, layer) for i, layer in enumerate(_layers(halves.pool, attr)) if layer.shape[0] > 0]
            attach_layers(found, [_kv_words(halves, attr, i, layer, real_kv) for i, layer in owned])
        out.append(found)
    return out


def _layerless_group(halves: _Halves, attr: str, group: int, half: int, real_kv: str) -> CanaryGroup:
    """Rows for a half with no layers; its real-KV words one zero row seen at every slot (row stride 0), as wide as
    the other half's, so the kernels read both halves with one geometry and find nothing to change."""
    import torch

    _, like0 = _first_layer(halves.like.pool, attr)
    rows = torch.zeros((halves.slots, 4), dtype=torch.int64, device=like0.device)
    found = CanaryGroup(group=group, half=half, rows=rows, holds_kv=False)
    if real_kv != "none":
        width = _kv_words(halves.like, attr, 0, like0, real_kv).shape[1]
        attach_layers(found, [torch.zeros((1, width), dtype=torch.int64, device=like0.device).expand(halves.slots, width)])
    return found


def _kv_words(halves: _Halves, attr: str, index: int, layer0: Any, real_kv: str) -> Any:
    """One layer's rows as int64 words: a view, so the kernels read the live real KV (quantised bytes included)."""
    import torch

    where = f"{type(halves.pool).__qualname__}.{attr}[{index}]"
    if halves.slots_per_row > 1:
        raise ValueError(
            f"kv canary: kv_canary_real_data={real_kv} needs one row per slot, but {where} "
            f"{tuple(layer0.shape)} holds a page of {halves.slots_per_row} slots per row (page-major layout); "
            "use kv_canary_real_data=none with this pool"
        )
    if not layer0.is_contiguous():
        raise ValueError(f"kv canary: kv_canary_real_data={real_kv} needs a contiguous {where}")
    row_bytes = layer0[0].numel() * layer0.element_size()
    if row_bytes % 8 != 0 or row_bytes < _BYTES_FOR_PARTIAL:
        raise ValueError(
            f"kv canary: kv_canary_real_data={real_kv} needs rows of {where} to be a multiple of 8 bytes and at "
            f"least {_BYTES_FOR_PARTIAL} bytes; got {row_bytes}"
        )
    return layer0.reshape(layer0.shape[0], -1).view(torch.int64)[: halves.slots]
