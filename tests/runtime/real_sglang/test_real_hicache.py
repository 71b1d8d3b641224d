"""Canary rows through HiCache's host tier, on sglang 0.5.20's real host pools (``MHATokenToKVPoolHost``,
``MLATokenToKVPoolHost``) beside its real device pools, allocators and ForwardBatch objects.

A cached prefix is backed up to the host pool, its device slots are freed (another request holds the rest of
the pool), then it is loaded back into whatever slots the allocator hands out and a new request reads it.
With the sidecar (``runtime/features/hicache.py``) a clean round trip reads clean, and both host-tier faults
(``runtime/perturb/hicache_faults.py``) are caught at that read. Without it, a clean round trip already reads as
violations and each fault changes nothing the canary reports: it cannot tell a faulty load from a clean one.

Built by hand: ``HostTier`` does what sglang's ``HiCacheController`` does for one write and one load with the
``direct`` io backend (host alloc, ``backup_from_device_all_layer``; device alloc, then
``load_to_device_per_layer`` for each layer); the controller itself needs CUDA streams to build. The
``direct`` backend's copy, ``sgl_kernel``'s ``transfer_kv_direct``, exists only on CUDA, so a torch
implementation of its contract (copy ``src[src_indices]`` to ``dst[dst_indices]``, layer by layer) stands in
for it on CPU.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from canary_instrument.runtime import mark_init_finished
from canary_instrument.runtime.features.hicache import STORAGE_REFUSAL, UnsupportedHiCacheError, find_host_pools
from canary_instrument.runtime.perturb.hicache_faults import inject_hicache_fault

from . import sglang_site
from .harness import RealRunner, Scheduler
from .test_real_serving import dev, server_args  # noqa: F401  (fixtures)

HOST_CLASSES = {"mha": ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKVPoolHost"),
                "mla": ("sglang.srt.mem_cache.pool_host.mla", "MLATokenToKVPoolHost")}
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
OTHER = [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    for src, dst in zip(src_layers, dst_layers):
        rows = src.index_select(0, src_indices.to(src.device)).to(dst.device)
        dst.index_copy_(0, dst_indices.to(dst.device), rows)


@pytest.fixture
def host_modules(sg, dev, monkeypatch):
    """The host-pool modules; their ``transfer_kv_direct`` is sgl_kernel's where it is installed (CUDA), the torch
    copy otherwise (CPU, or a CUDA machine where sglang_site made a stand-in for sgl_kernel)."""
    modules = {layout: importlib.import_module(path) for layout, (path, _) in HOST_CLASSES.items()}
    for module in modules.values():
        released = getattr(module, "transfer_kv_direct", None)
        if dev == "cpu" or released is None or isinstance(released, sglang_site._StandInMeta):
            monkeypatch.setattr(module, "transfer_kv_direct", _transfer_kv_direct, raising=False)
    return modules


class HostTier:
    """HiCache's controller for one write and one load at a time: with the ``direct`` io backend on the calling
    stream (as ``HiCacheController`` does it), with ``kernel`` on its own write and load streams behind a start
    event, the forward stream then waiting for the load (sglang waits per layer)."""

    def __init__(self, host_pool, device_pool, allocator, io_backend="direct"):
        self.mem_pool_host = host_pool
        self.mem_pool_device = device_pool
        self.mem_pool_device_allocator = allocator
        self.enable_storage = False
        self.storage_backend = None
        self.io_backend = io_backend
        self.streams = None
        if io_backend == "kernel":
            self.streams = torch.cuda.Stream(), torch.cuda.Stream()

    def move_indices(self, host_indices, device_indices):
        """The controller's ``move_indices``: ``kernel`` moves host indices to the device; ``direct`` with
        ``layer_first`` sorts them and keeps both on the host, the device indices in the same order."""
        if self.io_backend == "kernel":
            return host_indices.to(device_indices.device, non_blocking=True), device_indices
        host_indices, order = host_indices.sort()
        return host_indices, device_indices.cpu().index_select(0, order)

    def _on_stream(self, which):
        if self.streams is None:
            import contextlib

            return contextlib.nullcontext()
        stream = self.streams[which]
        start = torch.cuda.Event()
        start.record()
        start.wait(stream)
        return torch.cuda.stream(stream)

    def write(self, device_indices):
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        moved = self.move_indices(host_indices, device_indices)
        with self._on_stream(0):
            self.mem_pool_host.backup_from_device_all_layer(self.mem_pool_device, *moved, self.io_backend)
        return host_indices

    def load(self, host_indices):
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        moved = self.move_indices(host_indices, device_indices)
        with self._on_stream(1):
            for layer in range(self.mem_pool_host.layer_num):
                self.mem_pool_host.load_to_device_per_layer(self.mem_pool_device, *moved, layer, self.io_backend)
        if self.streams is not None:
            torch.cuda.current_stream().wait_stream(self.streams[1])
        return device_indices


class HiTree:
    """The two HiCache attributes of sglang's HiRadixCache the runtime walks to."""

    def __init__(self, tier, host_pool):
        self.cache_controller = tier
        self.token_to_kv_pool_host = host_pool


def _engine(sg, server_args, host_modules, layout, dev, realkv="all", io_backend="direct"):
    args = server_args("--kv-canary", "log", "--kv-canary-real-data", realkv)
    # 26 slots: two 12-token requests fill the pool but two, so the load reuses the freed request's slots.
    runner = RealRunner(sg, args, layout, device=dev, size=26)
    mark_init_finished(runner.canary_manager)
    path, name = HOST_CLASSES[layout]
    host = getattr(host_modules[layout], name)(
        runner.token_to_kv_pool, 2.0, 0, 1, "layer_first", pin_memory=dev == "cuda", device="cpu")
    tier = HostTier(host, runner.token_to_kv_pool, runner.token_to_kv_pool_allocator, io_backend)
    return runner, Scheduler(sg, runner), host, tier


def _round_trip(sg, server_args, host_modules, layout, dev, *, sidecar, fault=None, realkv="all", io_backend="direct"):
    """Back a request's prefix up, free it, load it back, read it from a new request; the violations."""
    runner, sched, host, tier = _engine(sg, server_args, host_modules, layout, dev, realkv, io_backend)
    if sidecar:
        runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    injected = inject_hicache_fault(host, fault) if fault else None
    a, b = sched.new_request(PROMPT), sched.new_request(OTHER)
    sched.step(sched.extend([a, b]))
    host_indices = tier.write(sched.tensor(a.slots))
    sched.finish(a)
    loaded = tier.load(host_indices)
    c = sched.new_request(PROMPT + [23])
    c.slots = loaded.tolist()
    next_tokens = sched.step(sched.extend([c]))
    sched.step(sched.decode([c], next_tokens))
    violations = runner.canary_manager.flush()
    if injected is not None:
        assert injected.injections, "the fault never fired"
    return violations, sorted(set(a.slots) & set(c.slots))


def _summary(violations):
    return sorted((v.slot, v.position, tuple(v.reasons)) for v in violations)


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_a_clean_round_trip_through_the_host_tier_reads_clean_with_the_sidecar(sg, server_args, host_modules, layout,
                                                                             dev):
    violations, reused = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=True)
    assert reused, "the load was meant to reuse slots freed since the last forward"
    assert violations == []


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_without_the_sidecar_a_clean_round_trip_already_reads_as_violations(sg, server_args, host_modules, layout,
                                                                           dev):
    violations, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=False)
    assert violations
    assert {v.position for v in violations} <= set(range(len(PROMPT)))  # the loaded prefix, nothing else


@pytest.mark.parametrize("layout", ["mha", "mla"])
@pytest.mark.parametrize("fault, reasons", [("hicache_host_copy", {"fingerprint"}),
                                            ("hicache_load_slots", {"position", "link"})])
def test_a_host_tier_fault_is_caught_at_the_next_read_and_missed_without_the_sidecar(
        sg, server_args, host_modules, layout, dev, fault, reasons):
    caught, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=True, fault=fault)
    assert caught
    assert reasons & {r for v in caught for r in v.reasons}
    assert {v.position for v in caught} <= set(range(len(PROMPT)))
    # Without the sidecar the faulty run reports exactly what the clean run does: the fault is invisible.
    clean, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=False)
    faulty, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=False, fault=fault)
    assert _summary(faulty) == _summary(clean)


def test_the_host_pool_is_found_by_structure_under_the_prefix_cache(sg, server_args, host_modules, dev):
    runner, _, host, tier = _engine(sg, server_args, host_modules, "mha", dev)
    assert find_host_pools(HiTree(tier, host)) == [host]
    assert find_host_pools(runner.token_to_kv_pool) == []  # the device pool holds KV but moves none

    class PoolEntry:  # sglang 0.5.23's host pool group (pool_host/group.py): named entries, one holds the KV
        def __init__(self, name, host_pool):
            self.name, self.host_pool = name, host_pool

    class HostPoolGroup:
        def __init__(self, entries):
            self.entries = entries
            self.anchor_entry = entries[0]

    tier.mem_pool_host = HostPoolGroup([PoolEntry("kv", host)])
    assert find_host_pools(HiTree(tier, None)) == [host]


def test_the_storage_tier_is_refused_at_attach_and_when_attached_later(sg, server_args, host_modules, dev):
    runner, _, host, tier = _engine(sg, server_args, host_modules, "mha", dev)
    tier.enable_storage = True
    with pytest.raises(UnsupportedHiCacheError) as refused:
        runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    assert "batch_set_v1" in str(refused.value) and str(refused.value).endswith(STORAGE_REFUSAL)
    tier.enable_storage = False
    tier.attach_storage_backend = lambda *a, **k: "attached"
    runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    with pytest.raises(UnsupportedHiCacheError, match="storage tier"):
        tier.attach_storage_backend("file")


def test_a_release_with_physical_index_transfers_has_its_entry_point_wrapped_once(sg, server_args, host_modules, dev):
    """sglang 0.5.21 and later call ``*_physical`` methods, which call the plain ones: only the entry is wrapped,
    so the rows move once and a clean round trip still reads clean."""
    runner, sched, host, tier = _engine(sg, server_args, host_modules, "mha", dev)

    def backup_physical(device_pool, host_indices, device_indices, io_backend):
        host.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

    def load_physical(device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
        host.load_to_device_per_layer(device_pool, host_indices, device_indices, layer_id, io_backend)

    # The 0.5.21 base class's delegating pair, on this instance (0.5.20's class has none).
    host.backup_from_device_all_layer_physical = backup_physical
    host.load_to_device_per_layer_physical = load_physical
    tier.mem_pool_host = host
    runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    assert getattr(host.backup_from_device_all_layer_physical, "__kv_canary_hicache__", False)
    assert "backup_from_device_all_layer" not in host.__dict__ and "load_to_device_per_layer" not in host.__dict__
    a, b = sched.new_request(PROMPT), sched.new_request(OTHER)
    sched.step(sched.extend([a, b]))
    host_indices = host.alloc(len(a.slots))
    moved = tier.move_indices(host_indices, sched.tensor(a.slots))
    host.backup_from_device_all_layer_physical(runner.token_to_kv_pool, *moved, "direct")
    sched.finish(a)
    loaded = runner.token_to_kv_pool_allocator.alloc(len(PROMPT))
    moved = tier.move_indices(host_indices, loaded)
    for layer in range(host.layer_num):
        host.load_to_device_per_layer_physical(runner.token_to_kv_pool, *moved, layer, "direct")
    c = sched.new_request(PROMPT + [23])
    c.slots = loaded.tolist()
    sched.step(sched.extend([c]))
    assert runner.canary_manager.flush() == []


def test_host_tiers_the_canary_cannot_follow_are_refused_at_attach(sg, server_args, host_modules, dev):
    runner, _, host, tier = _engine(sg, server_args, host_modules, "mha", dev)
    runner.token_to_kv_pool.host_transfer_translate = lambda indices: indices
    with pytest.raises(UnsupportedHiCacheError, match="host_transfer_translate"):
        runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    del runner.token_to_kv_pool.host_transfer_translate
    tier.mem_pool_host = object()  # a host pool group whose entries hold no transfer methods
    with pytest.raises(UnsupportedHiCacheError, match="no host pool under it"):
        runner.canary_manager.attach_radix_cache(HiTree(tier, None))


def test_hicache_of_an_swa_pool_is_refused_at_attach(sg, server_args, host_modules, dev):
    args = server_args("--kv-canary", "log")
    runner = RealRunner(sg, args, "swa", device=dev)
    full = runner.token_to_kv_pool.full_kv_pool
    host = host_modules["mha"].MHATokenToKVPoolHost(full, 2.0, 0, 1, "layer_first", pin_memory=False, device="cpu")
    tier = HostTier(host, full, runner.token_to_kv_pool_allocator)
    with pytest.raises(UnsupportedHiCacheError, match="SWA pool"):
        runner.canary_manager.attach_radix_cache(HiTree(tier, host))


def test_removing_a_fault_puts_the_canary_wrapper_back(sg, server_args, host_modules, dev):
    runner, _, host, tier = _engine(sg, server_args, host_modules, "mha", dev)
    runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    wrapped = {name: host.__dict__[name] for name in ("backup_from_device_all_layer", "load_to_device_per_layer")}
    faults = [inject_hicache_fault(host, kind) for kind in ("hicache_host_copy", "hicache_load_slots")]
    assert all(host.__dict__[name] is not wrapped[name] for name in wrapped)
    for fault in faults:
        fault.remove()
    assert {name: host.__dict__[name] for name in wrapped} == wrapped
    with pytest.raises(ValueError, match="unknown HiCache fault 'flip'; known: hicache_host_copy, hicache_load_slots"):
        inject_hicache_fault(host, "flip")


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_the_kernel_io_backend_round_trip_on_transfer_streams(sg, server_args, host_modules, layout, dev):
    """sglang's default io backend: its CUDA transfer kernels, on the controller's own streams; the rows are
    enqueued on the same streams as the KV, so the read after the load sees both."""
    if dev != "cuda":
        pytest.skip("the kernel io backend moves KV with sgl_kernel's CUDA kernels")
    released = getattr(host_modules[layout], "transfer_kv_per_layer", None)
    if released is None or isinstance(released, sglang_site._StandInMeta):
        pytest.skip("sgl_kernel is not installed on this CUDA machine")
    clean, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=True, io_backend="kernel")
    assert clean == []
    for fault, reasons in (("hicache_host_copy", {"fingerprint"}), ("hicache_load_slots", {"position", "link"})):
        caught, _ = _round_trip(sg, server_args, host_modules, layout, dev, sidecar=True, fault=fault,
                                io_backend="kernel")
        assert reasons & {r for v in caught for r in v.reasons}, fault


def test_the_wrapped_host_pool_is_freed_without_the_garbage_collector(sg, server_args, host_modules, dev):
    """The wrappers live on the host pool and hold it, and the canary, only weakly: no reference cycle keeps an
    engine's host tier alive until a collection (which could run while another engine captures a graph)."""
    import gc
    import weakref

    runner, _, host, tier = _engine(sg, server_args, host_modules, "mha", dev)
    runner.canary_manager.attach_radix_cache(HiTree(tier, host))
    host_ref = weakref.ref(host)
    runner.canary_manager.radix_cache = None  # the engine drops its cache (the canary keeps it while it lives)
    gc.disable()
    try:
        del host, tier
        assert host_ref() is None
    finally:
        gc.enable()
