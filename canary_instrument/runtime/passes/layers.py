"""Real-KV fingerprints beyond layer 0: every layer's buffer of a (group, half) and where its fingerprints live.

Layer 0's fingerprint is the canary row's own field 3; layers 1.. keep theirs in a per-half table
``layer_fingerprints[slot, layer - 1]`` (8 bytes per slot and layer, against a KV row of hundreds
of bytes to kilobytes per slot and layer), stored layer-major. The kernels reach every layer's buffer through one
device table of per-layer data pointers, so the layer a pass reads can be a device value.
"""

from __future__ import annotations

from typing import Any, Sequence

from canary_instrument.runtime.passes.state import CanaryGroup


def attach_layers(group: CanaryGroup, layers: Sequence[Any]) -> CanaryGroup:
    """Give ``group`` every layer's int64 word view (``layers[0]`` becomes ``kv_words``), the pointer table and a
    zeroed fingerprint table for layers 1..; all layers must share layer 0's shape and strides."""
    import torch

    first = layers[0]
    for index, words in enumerate(layers):
        if words.dtype != torch.int64 or words.shape != first.shape or words.stride() != first.stride():
            raise ValueError(
                f"kv canary: layer {index}'s KV rows are {words.dtype} {tuple(words.shape)} stride {words.stride()}, "
                f"layer 0's {first.dtype} {tuple(first.shape)} stride {first.stride()}: the fingerprint reads every "
                "layer of a half with one geometry"
            )
        if words.device != first.device:
            raise ValueError(f"kv canary: layer {index}'s KV is on {words.device}, layer 0's on {first.device}")
    group.kv_words = first
    group.kv_layers = list(layers)
    group.kv_layer_ptrs = None
    pointer_table(group)
    slots = group.rows.shape[0]
    group.layer_fingerprints = _layer_major(slots, max(1, len(layers) - 1), first.device)
    return group


def layer_count(group: CanaryGroup) -> int:
    """Layers whose KV this half fingerprints (1 when only layer 0 is attached)."""
    return len(group.kv_layers) if group.kv_layers else 1


def layer_words(group: CanaryGroup, layer: int) -> Any:
    """Layer ``layer``'s KV rows of this half as int64 words [slots, words]."""
    return group.kv_layers[layer] if group.kv_layers else group.kv_words


def fingerprint_table(group: CanaryGroup) -> Any:
    """The int64 [slots, max(1, layers - 1)] table of layers 1..'s fingerprints, made on first use (layer 0 only:
    one unused column, so both backends always have a table to point at)."""
    if group.layer_fingerprints is None:
        group.layer_fingerprints = _layer_major(group.rows.shape[0], 1, group.rows.device)
    return group.layer_fingerprints


def _layer_major(slots: int, columns: int, device: Any) -> Any:
    """A zeroed [slots, columns] view of layer-major storage: a pass reads one layer of a request's slots, and
    contiguous slots then read contiguous words (slot-major storage would cost one memory sector per lane)."""
    import torch

    return torch.zeros((columns, slots), dtype=torch.int64, device=device).t()


def pointer_table(group: CanaryGroup) -> Any:
    """int64 [layers]: each layer's data pointer. Rebuilt when layer 0's buffer moved (a copied or re-homed state
    would otherwise point the kernels at the old memory); made before any graph capture, by the first pass."""
    import torch

    key = (group.kv_words.data_ptr(), layer_count(group))
    if group.kv_layer_ptrs is None or getattr(group, "_pointer_key", None) != key:
        layers = group.kv_layers or [group.kv_words]
        host = torch.tensor([w.data_ptr() for w in layers], dtype=torch.int64)
        if group.rows.device.type == "cuda":
            # Through pinned memory, kept alive with the table: a pageable copy would wait for the device.
            host = host.pin_memory()
            group.kv_layer_ptrs = host.to(group.rows.device, non_blocking=True)
        else:
            group.kv_layer_ptrs = host.to(group.rows.device)
        group._pointer_host = host
        group._pointer_key = key
    return group.kv_layer_ptrs


def stored_fingerprint(group: CanaryGroup, slots: Any, layer: int) -> Any:
    """The fingerprints stored for ``slots`` of layer ``layer`` (0 = unwritten)."""
    if layer == 0:
        return group.rows[slots, 3]
    return fingerprint_table(group)[slots, layer - 1]


def store_fingerprint(group: CanaryGroup, slots: Any, layer: int, values: Any) -> None:
    if layer == 0:
        group.rows[slots, 3] = values
    else:
        fingerprint_table(group)[slots, layer - 1] = values


def cursor_table(state: Any) -> Any:
    """``state.layer_cursor``, made (zeros, one entry per req-pool row) on first use."""
    import torch

    if state.layer_cursor is None:
        state.layer_cursor = torch.zeros(state.req_to_token.shape[0], dtype=torch.int64,
                                         device=state.req_to_token.device)
    return state.layer_cursor
