"""Every KV pool class of sglang 0.5.20 that builds on CPU, judged by the runtime's structural pool detection:
the supported ones get one canary row per slot (padding slot 0 included) and, with real-KV fingerprints, a
live view of layer 0's bytes (quantised bytes included); the others are refused at install with the class,
the reason and what is supported. docs/runtime.md section 9 lists every class, including those that need a
GPU or a unified buffer to build.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from canary_instrument.runtime.setup.pools import UnsupportedPoolError, attach_pool

BASE = dict(size=64, page_size=1, dtype=torch.bfloat16, layer_num=2, device="cpu", enable_memory_saver=False)
MHA = dict(head_num=2, head_dim=32)
MLA = dict(kv_lora_rank=48, qk_rope_head_dim=16)


def _swa(sg, sub_pool, sub_kwargs):
    mp, swa = sg.memory_pool, sg.swa_memory_pool
    kwargs = dict(page_size=1, device="cpu", enable_memory_saver=False, **sub_kwargs)
    pool = swa.SWAKVPool(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=32,
        swa_attention_layer_ids=[1], full_attention_layer_ids=[0], device="cpu",
        token_to_kv_pool_class=getattr(mp, sub_pool), full_kv_pool_kwargs=kwargs, swa_kv_pool_kwargs=kwargs,
    )
    allocator = sg.swa_allocator.SWATokenToKVPoolAllocator(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, device="cpu", kvcache=pool, need_sort=False
    )
    return pool, allocator


# class -> (builder, layout, layer-0 buffer of the first canary group, dtype stored there)
SUPPORTED = {
    "MHATokenToKVPool": (lambda sg: sg.memory_pool.MHATokenToKVPool(**BASE, **MHA), "mha", "k_buffer"),
    "MHATokenToKVPoolFP4": (lambda sg: sg.memory_pool.MHATokenToKVPoolFP4(**BASE, **MHA), "mha", "k_buffer"),
    "MHATokenToKVPoolMXFP8": (lambda sg: sg.memory_pool.MHATokenToKVPoolMXFP8(**BASE, **MHA), "mha", "k_buffer"),
    "MLATokenToKVPool": (lambda sg: sg.memory_pool.MLATokenToKVPool(**BASE, **MLA), "mla", "kv_buffer"),
    "MLATokenToKVPoolFP4": (lambda sg: sg.memory_pool.MLATokenToKVPoolFP4(**BASE, **MLA), "mla", "kv_buffer"),
    "DSATokenToKVPool": (
        lambda sg: sg.memory_pool.DSATokenToKVPool(
            **dict(BASE, page_size=64), **MLA, index_head_dim=128, kv_cache_dim=MLA["kv_lora_rank"] + 16
        ),
        "mla",
        "kv_buffer",
    ),
    "HybridLinearKVPool": (
        # Its recurrent (mamba) state is per request, not per slot, and is not guarded: built without one.
        lambda sg: sg.memory_pool.HybridLinearKVPool(
            size=64, dtype=torch.bfloat16, page_size=1, head_num=2, head_dim=32, full_attention_layer_ids=[0, 2],
            device="cpu", mamba_pool=None,
        ),
        "mha",
        "k_buffer",
    ),
}


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_supported_pool_gets_a_canary_row_per_slot_and_a_live_view_of_every_layer(sg, name):
    build, layout, attr = SUPPORTED[name]
    pool = build(sg)
    attached = attach_pool(pool, real_kv="partial", window=None)
    assert attached.layout == layout
    guarded = getattr(pool, "full_kv_pool", pool)
    layer0 = getattr(guarded, attr)[0]
    slots = guarded.size + guarded.page_size
    assert [g.rows.shape for g in attached.groups] == [torch.Size([slots, 4])] * (2 if layout == "mha" else 1)
    words = attached.groups[0].kv_words
    assert words.data_ptr() == layer0.data_ptr() and words.shape[0] == slots
    layer0.view(torch.uint8).view(slots, -1)[5, 0] ^= 0xFF  # the view reads the real bytes as they change
    assert int(words[5, 0]) != 0
    layers = getattr(guarded, attr)
    for group in attached.groups:
        buffers = getattr(guarded, group_attr(layout, group))
        assert [w.data_ptr() for w in group.kv_layers] == [b.data_ptr() for b in buffers]
        assert group.kv_layer_ptrs.tolist() == [w.data_ptr() for w in group.kv_layers]
        assert group.layer_fingerprints.shape == (slots, max(1, len(layers) - 1))
    assert name in attached.description


def group_attr(layout, group):
    return "kv_buffer" if layout == "mla" else ("k_buffer", "v_buffer")[group.half]


def test_swa_pool_with_its_allocator_mapping(sg):
    pool, allocator = _swa(sg, "MHATokenToKVPool", MHA)
    attached = attach_pool(pool, real_kv="partial", window=8, allocator=allocator)
    assert attached.layout == "swa"
    assert attached.swa_mapping is allocator.full_to_swa_index_mapping
    assert [(g.group, g.half, g.rows.shape[0]) for g in attached.groups] == [(0, 0, 65), (0, 1, 65), (1, 0, 33), (1, 1, 33)]


def test_hnd_page_major_mha_pool_is_guarded_without_real_kv_fingerprints(sg, monkeypatch):
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    pool = sg.memory_pool.MHATokenToKVPool(**dict(BASE, page_size=4), **MHA)
    assert pool.kv_cache_layout == "hnd" and pool.k_buffer[0].shape[0] == (64 + 4) // 4
    attached = attach_pool(pool, real_kv="none", window=None)
    assert [g.rows.shape[0] for g in attached.groups] == [68, 68]
    with pytest.raises(ValueError, match=r"kv_canary_real_data=partial needs one row per slot.*page-major"):
        attach_pool(pool, real_kv="partial", window=None)


REFUSED = {
    "NoOpMHATokenToKVPool": (
        lambda sg: sg.memory_pool.NoOpMHATokenToKVPool(**BASE, **MHA),
        r"k_buffer\[0\] has 1 rows for 65 slots .* stores no KV row per slot",
    ),
    "MHATokenToKOnlyPool": (
        lambda sg: sg.memory_pool.MHATokenToKOnlyPool(**BASE, **MHA),
        r"k_buffer list but no v_buffer list",
    ),
    "MiniMaxSparseKVPool": (
        lambda sg: sg.memory_pool.MiniMaxSparseKVPool(
            size=64, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=32, idx_head_dim=16,
            dense_layer_ids=[0], sparse_layer_ids=[1], device="cpu", start_layer=0, end_layer=2,
        ),
        r"no per-layer KV buffer list .* and no full_kv_pool",
    ),
    "SWAKVPool(MLATokenToKVPool sub-pools)": (
        lambda sg: _swa(sg, "MLATokenToKVPool", MLA)[0],
        r"full_kv_pool MLATokenToKVPool is an MLA pool; the SWA canary layout guards MHA sub-pools",
    ),
    "HiSparseDSATokenToKVPool": (
        lambda sg: importlib.import_module("sglang.srt.mem_cache.hisparse_memory_pool").HiSparseDSATokenToKVPool(
            **dict(BASE, page_size=64), **MLA, index_head_dim=128, kv_cache_dim=MLA["kv_lora_rank"] + 16
        ),
        r"index mapping registered by its allocator names \(register_mapping\)",
    ),
    "MHATokenToKVPoolHost": (
        lambda sg: importlib.import_module("sglang.srt.mem_cache.pool_host.mha").MHATokenToKVPoolHost(
            sg.memory_pool.MHATokenToKVPool(**BASE, **MHA), 2.0, 0, 1, "layer_first", pin_memory=False, device="cpu"
        ),
        r"holds kv_buffer as one Tensor, not a per-layer list \(a host/offload pool",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_pool_is_refused_naming_class_reason_and_what_is_supported(sg, name):
    build, reason = REFUSED[name]
    pool = build(sg)
    with pytest.raises(UnsupportedPoolError) as refused:
        attach_pool(pool, real_kv="none", window=8)
    message = str(refused.value)
    assert f"unsupported KV pool {type(pool).__module__}.{type(pool).__qualname__}" in message
    assert "supported: an MHA pool" in message
    import re

    assert re.search(reason, message), message


def test_swa_pool_before_its_allocator_exists_is_refused(sg):
    pool = sg.swa_memory_pool.SWAKVPool(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=32,
        swa_attention_layer_ids=[1], full_attention_layer_ids=[0], device="cpu", enable_memory_saver=False,
    )
    with pytest.raises(UnsupportedPoolError, match=r"no full_to_swa_index_mapping tensor .* after the SWA allocator"):
        attach_pool(pool, real_kv="none", window=8)


def test_swa_pool_of_a_model_with_only_sliding_layers_keeps_the_full_slots_rows(sg):
    # A multi-layer EAGLE draft's MTP layer is a sliding-window one: sglang builds its SWA pool with a full
    # sub-pool of no layers. The full slots still carry the bookkeeping; the SWA half's real KV is read live.
    mp, swa = sg.memory_pool, sg.swa_memory_pool
    kwargs = dict(page_size=1, device="cpu", enable_memory_saver=False, **MHA)
    pool = swa.SWAKVPool(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=32,
        swa_attention_layer_ids=[0], full_attention_layer_ids=[], device="cpu",
        token_to_kv_pool_class=mp.MHATokenToKVPool, full_kv_pool_kwargs=kwargs, swa_kv_pool_kwargs=kwargs,
    )
    allocator = sg.swa_allocator.SWATokenToKVPoolAllocator(
        size=64, size_swa=32, page_size=1, dtype=torch.bfloat16, device="cpu", kvcache=pool, need_sort=False
    )
    assert pool.full_kv_pool.k_buffer == [] and pool.full_kv_pool.v_buffer == []
    attached = attach_pool(pool, real_kv="partial", window=8, allocator=allocator)
    assert [(g.group, g.half, g.rows.shape[0], g.holds_kv) for g in attached.groups] == [
        (0, 0, 65, False), (0, 1, 65, False), (1, 0, 33, True), (1, 1, 33, True)]
    full_k, swa_k = attached.groups[0], attached.groups[2]
    assert swa_k.kv_words.data_ptr() == pool.swa_kv_pool.k_buffer[0].data_ptr()
    assert full_k.kv_words.shape == (65, swa_k.kv_words.shape[1]) and not full_k.kv_words.any()
    assert "no layers" in attached.description
