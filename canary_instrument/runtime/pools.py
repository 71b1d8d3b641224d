"""Attach canary rows to a KV pool, recognised by structure (MHA, MLA, SWA), never by class name.

An unknown pool is an error naming its class: a silent skip would leave the cache unguarded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from canary_instrument.runtime.state import GROUP_FULL, GROUP_SWA, HALF_K, HALF_V, CanaryGroup

_BYTES_FOR_PARTIAL = 16


@dataclass
class AttachedPool:
    layout: str  # "mha" | "mla" | "swa"
    groups: list[CanaryGroup]
    swa_mapping: Optional[Any] = None
    swa_window: int = 0


def detect_layout(pool: Any) -> str:
    if all(hasattr(pool, a) for a in ("full_kv_pool", "swa_kv_pool", "full_to_swa_index_mapping")):
        return "swa"
    if _layers(pool, "kv_buffer") is not None:
        return "mla"
    if _layers(pool, "k_buffer") is not None and _layers(pool, "v_buffer") is not None:
        return "mha"
    raise ValueError(
        f"kv canary: unsupported KV pool {type(pool).__module__}.{type(pool).__qualname__}: expected an MHA pool "
        "(k_buffer and v_buffer lists), an MLA pool (kv_buffer list) or an SWA pool (full_kv_pool, swa_kv_pool, "
        "full_to_swa_index_mapping)"
    )


def attach_pool(pool: Any, *, real_kv: str, window: Optional[int]) -> AttachedPool:
    """Allocate zeroed canary rows beside ``pool`` (one int64[4] row per slot and half)."""
    layout = detect_layout(pool)
    if layout == "mla":
        groups = [_group(pool, "kv_buffer", GROUP_FULL, HALF_K, real_kv)]
        return AttachedPool("mla", groups)
    if layout == "mha":
        return AttachedPool("mha", _mha_groups(pool, GROUP_FULL, real_kv))
    full, swa = pool.full_kv_pool, pool.swa_kv_pool
    for name, sub in (("full_kv_pool", full), ("swa_kv_pool", swa)):
        if detect_layout(sub) != "mha":
            raise ValueError(
                f"kv canary: SWA pool {type(pool).__qualname__}.{name} must be an MHA pool "
                f"(k_buffer and v_buffer), got {type(sub).__qualname__}"
            )
    mapping = pool.full_to_swa_index_mapping
    if window is None or int(window) <= 0:
        raise ValueError(
            f"kv canary: SWA pool {type(pool).__qualname__} needs model_runner.sliding_window_size > 0; got {window!r}"
        )
    groups = _mha_groups(full, GROUP_FULL, real_kv) + _mha_groups(swa, GROUP_SWA, real_kv)
    return AttachedPool("swa", groups, swa_mapping=mapping, swa_window=int(window))


def _mha_groups(pool: Any, group: int, real_kv: str) -> list[CanaryGroup]:
    return [_group(pool, "k_buffer", group, HALF_K, real_kv), _group(pool, "v_buffer", group, HALF_V, real_kv)]


def _layers(pool: Any, attr: str) -> Optional[list]:
    layers = getattr(pool, attr, None)
    if isinstance(layers, (list, tuple)) and len(layers) > 0:
        return list(layers)
    return None


def _group(pool: Any, attr: str, group: int, half: int, real_kv: str) -> CanaryGroup:
    import torch

    layer0 = _layers(pool, attr)[0]
    rows = torch.zeros((layer0.shape[0], 4), dtype=torch.int64, device=layer0.device)
    return CanaryGroup(group=group, half=half, rows=rows, kv_words=_kv_words(pool, attr, layer0, real_kv))


def _kv_words(pool: Any, attr: str, layer0: Any, real_kv: str) -> Optional[Any]:
    """Layer 0's rows as int64 words: a view, so the kernels read the live real KV."""
    import torch

    if real_kv == "none":
        return None
    where = f"{type(pool).__qualname__}.{attr}[0]"
    if not layer0.is_contiguous():
        raise ValueError(f"kv canary: kv_canary_real_kv={real_kv} needs a contiguous {where}")
    row_bytes = layer0[0].numel() * layer0.element_size()
    if row_bytes % 8 != 0 or row_bytes < _BYTES_FOR_PARTIAL:
        raise ValueError(
            f"kv canary: kv_canary_real_kv={real_kv} needs rows of {where} to be a multiple of 8 bytes and at "
            f"least {_BYTES_FOR_PARTIAL} bytes; got {row_bytes}"
        )
    return layer0.reshape(layer0.shape[0], -1).view(torch.int64)
