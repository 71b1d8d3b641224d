"""The demo's HiCache part: faults in the host tier, the control run without the canary's sidecar, and the
runtime's refusal of an SWA pool.

The engine runs its hierarchical cache (``enable_hierarchical_cache``): cached KV is backed up to a host pool
and loaded back on a prefix hit. The runtime finds the host pool by structure under the prefix cache and
keeps a sidecar of canary rows beside it (``runtime/features/hicache.py``). A fault is one of the runtime's host-tier
kinds (``runtime/perturb/hicache_faults.py``) switched on for that host pool; its injection is the moment the
corruption reaches the device: the rotated load itself, or the load of a host slot whose copy was flipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from canary_instrument.demo.injected import Injection

# A clean run starts from an empty cache: nothing leaves the device before the pool has filled up once.
MIN_CLEAN_STEPS = 40


def clean_steps(matrix_clean_steps: int) -> int:
    """Steps of each HiCache clean run: a quarter of the matrix's (two runs per layout, and the load-backs
    start once the pool is full), at least MIN_CLEAN_STEPS."""
    return max(MIN_CLEAN_STEPS, matrix_clean_steps // 4)


def host_pool(engine) -> Any:
    """The engine's host KV pool, found the way the runtime finds it (by structure under the prefix cache)."""
    from canary_instrument.runtime.features.hicache_find import find_host_pools

    pools = find_host_pools(engine.scheduler.tree_cache)
    if not pools:
        raise RuntimeError("HiCache faults need an engine with a host tier (enable_hierarchical_cache)")
    return pools[0]


def _wrap_outermost(pool: Any, name: str, around: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Wrap ``pool.<name>`` on the instance outside whatever is there; returns the undo."""
    import inspect

    before = pool.__dict__.get(name)
    inner = getattr(pool, name)
    call = around(inner)
    call.__signature__ = inspect.signature(inner)  # still reads as a host pool's transfer method
    setattr(pool, name, call)

    def undo():
        if before is None:
            pool.__dict__.pop(name, None)
        else:
            pool.__dict__[name] = before

    return undo


class ArmedHiCacheFault:
    """One host-tier fault kind switched on (rate ``rate``) for the engine's host pool until disarmed.

    ``hicache_load_slots`` is injected by the first load it rotates; ``hicache_host_copy`` flips a byte of one
    host slot per backup and is injected when a load brings a flipped copy back to the device (a later backup
    of that host slot overwrites the flip). So that such a load comes, a user returns to a conversation the
    device no longer holds (a request with its cached tokens and one more, admitted first): for a flipped
    copy, the first one whose device copy is evicted. ``returns`` lists those requests by step, and
    ``replay`` makes a run send the same ones."""

    RETURN_NEW_TOKENS = 4

    def __init__(self, fault, engine: Any, rng: random.Random, rate: float = 1.0, replay: Optional[list] = None):
        from canary_instrument.runtime.features.hicache_find import host_transfers
        from canary_instrument.runtime.perturb.hicache_faults import inject_hicache_fault

        self.fault, self.engine = fault, engine
        self.injection = None
        self.pool = host_pool(engine)
        self.flipped: dict[int, int] = {}  # host slot -> step whose backup flipped it (host_copy)
        self.returns: list = []  # (step, prompt) of the requests sent back to a flipped conversation
        self._replay = None if replay is None else list(replay)
        self._token = random.Random(rng.randrange(1 << 30))
        self.armed = inject_hicache_fault(self.pool, fault.hicache_kind, rate=rate, seed=rng.randrange(1 << 30))
        backup, load = host_transfers(self.pool)
        self._undo = []
        if fault.hicache_kind == "hicache_host_copy":
            self._undo.append(_wrap_outermost(self.pool, backup.name, lambda inner: self._watch_backup(inner, backup)))
            self._undo.append(_wrap_outermost(self.pool, load.name, lambda inner: self._watch_load(inner, load)))

    def _step(self) -> int:
        return self.engine.scheduler.forward_ct + 1  # transfers run while the scheduler builds the next batch

    def _watch_backup(self, inner: Callable, backup) -> Callable:
        def call(*args, **kwargs):
            for slot in backup.argument(args, kwargs, "host_indices").reshape(-1).tolist():
                self.flipped.pop(slot, None)  # overwritten by this backup
            done = len(self.armed.injections)
            result = inner(*args, **kwargs)
            for hit in self.armed.injections[done:]:
                self.flipped[int(hit["host_slot"].reshape(-1)[0])] = self._step()
            return result

        return call

    def _watch_load(self, inner: Callable, load) -> Callable:
        def call(*args, **kwargs):
            if self.injection is None and load.argument(args, kwargs, "layer_id") == 0:
                host = load.argument(args, kwargs, "host_indices").reshape(-1).tolist()
                device = load.argument(args, kwargs, "device_indices").reshape(-1).tolist()
                hit = next((i for i, slot in enumerate(host) if slot in self.flipped), None)
                if hit is not None:
                    self.injection = Injection(
                        self._step(),
                        f"host slot {host[hit]} (K of every layer flipped after its backup at step "
                        f"{self.flipped[host[hit]]}) loaded back into device slot {device[hit]}",
                        self.fault.expected)
            return inner(*args, **kwargs)

        return call

    def poll(self, violations: tuple = ()):
        self._send_returns()
        if self.injection is not None or self.fault.hicache_kind != "hicache_load_slots" or not self.armed.injections:
            return
        hit = self.armed.injections[0]
        slots, moved = hit["device_slots"].reshape(-1).tolist(), hit["moved_to"].reshape(-1).tolist()
        self.injection = Injection(
            self.engine.scheduler.forward_ct,
            f"a load of {len(slots)} host slots wrote device slots {moved[:4]}{'...' if len(slots) > 4 else ''}, "
            f"the cache names {slots[:4]}{'...' if len(slots) > 4 else ''}",
            self.fault.expected)

    def _send_returns(self):
        step = self.engine.scheduler.forward_ct + 1
        if self._replay is not None:
            prompts = [prompt for at, prompt in self._replay if at == step]
        elif self.injection is None and not self.returns:
            found = self._evicted_path()
            prompts = [] if found is None else [found]
        else:
            prompts = []
        scheduler = self.engine.scheduler
        for prompt in prompts:
            self.engine.add_request(prompt, self.RETURN_NEW_TOKENS)
            scheduler.waiting.insert(0, scheduler.waiting.pop())  # admitted first: the load comes at once
            self.returns.append((step, prompt))

    def _evicted_path(self) -> Optional[list]:
        """For ``hicache_host_copy``, a path down to a flipped host slot; for ``hicache_load_slots``, one whose host
        tail has two slots or more (a load of one slot has nothing to rotate)."""
        if self.fault.hicache_kind == "hicache_host_copy":
            return evicted_path(self.engine, self._token, lambda node: node.host_value[0] in self.flipped)
        return evicted_path(self.engine, self._token, lambda node: node.parent.evicted)

    def disarm(self):
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.armed.remove()


def evicted_path(engine, rng: random.Random, accept: Callable[[Any], bool] = lambda node: True) -> Optional[list]:
    """The tokens of a cached path down to a node the device no longer holds (only the host does) that
    ``accept`` takes, and one more token: a request with them makes the cache load that tail back. None if
    there is no such node (or its path leaves no room for the returning request's new tokens)."""
    cache = engine.scheduler.tree_cache
    room = engine.server_args.max_context_len - 1 - ArmedHiCacheFault.RETURN_NEW_TOKENS
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.evicted or not accept(node):
            continue
        tokens = []
        while node is not cache.root:
            tokens.append(node.key[0])
            node = node.parent
        if len(tokens) < room:
            return tokens[::-1] + [rng.randrange(engine.server_args.vocab_size)]
    return None


class ReturningWorkload:
    """The matrix's workload, plus a user who returns to a conversation the device evicted every few steps,
    so that a short run loads KV back from the host too."""

    EVERY = 4

    def __init__(self, engine, rng: random.Random):
        from canary_instrument.demo.workload import Workload

        self.engine, self.rng = engine, rng
        self.inner = Workload(engine, rng)
        self.steps = 0

    def step(self):
        self.steps += 1
        if self.steps % self.EVERY == 0:
            prompt = evicted_path(self.engine, self.rng)
            if prompt is not None:
                self.engine.add_request(prompt, ArmedHiCacheFault.RETURN_NEW_TOKENS)
        return self.inner.step()


def swa_refusal(engine_module, engine_args: dict) -> str:
    """What the runtime says when the engine's host tier is built for an SWA model's full-attention pool (the
    engine itself offers no SWA host tier): the error ``attach_radix_cache`` raises."""
    import importlib

    from canary_instrument.runtime.features.hicache import UnsupportedHiCacheError

    package = engine_module.__name__.split(".")[0]
    hiradix = importlib.import_module(f"{package}.srt.mem_cache.hiradix_cache")
    engine = engine_module.Engine(**dict(engine_args, attention_layout="swa"))
    runner = engine.model_runner
    cache = hiradix.HiRadixCache(runner.token_to_kv_pool_allocator.full_attn_allocator,
                                 runner.token_to_kv_pool.full_kv_pool, 2.0)
    try:
        runner.canary_manager.attach_radix_cache(cache)
    except UnsupportedHiCacheError as error:
        return str(error)
    raise RuntimeError("the runtime followed HiCache of an SWA pool; the demo expected it to refuse")


@dataclass
class ControlResult:
    """A host-tier fault on an engine whose canary has no sidecar: what it reports at the fault's first read,
    against the same run without the fault."""

    injection: Optional[Any]
    at_fault: list  # (slot, position, reasons) reported at the injection step, faulty run
    at_same_step_clean: list  # the same, run without the fault
    clean_violations: int  # violations reported in the clean steps before the injection (false alarms)

    @property
    def missed(self) -> bool:
        """The fault changed nothing the canary reports: it cannot be told from a clean load-back."""
        return self.injection is not None and self.at_fault == self.at_same_step_clean


def _summary(violations) -> list:
    return sorted((v.slot, v.position, tuple(v.reasons)) for v in violations)


def control_trial(make_bench: Callable[[], Any], fault, seed: int, warmup: tuple[int, int] = (2, 6),
                  max_wait: int = 40) -> ControlResult:
    """Run one trial of ``fault`` without the sidecar, then the same steps on a fresh engine with the fault
    switched on at rate 0 (and the same returning requests), and compare what the canary reports at the
    injection step."""
    from canary_instrument.demo.workload import Workload
    from canary_instrument.runtime.features.hicache import unwrap

    def run(rate: float, stop_at: Optional[int], replay: Optional[list]):
        bench = make_bench()
        unwrap(host_pool(bench.engine))  # the canary's rows no longer follow the host tier
        rng = random.Random(seed)
        workload = Workload(bench.engine, rng)
        steps = {}
        for _ in range(rng.randint(*warmup)):
            steps[bench.engine.scheduler.forward_ct + 1] = bench.step(workload)
        armed = ArmedHiCacheFault(fault, bench.engine, rng, rate=rate, replay=replay)
        try:
            for _ in range(max_wait):
                step = bench.engine.scheduler.forward_ct + 1
                steps[step] = bench.step(workload)
                armed.poll()
                if armed.injection is not None or step == stop_at:
                    break
        finally:
            armed.disarm()
        return armed.injection, steps, armed.returns

    injection, faulty, returns = run(1.0, None, None)
    if injection is None:
        return ControlResult(None, [], [], sum(map(len, faulty.values())))
    _, clean, _ = run(0.0, injection.step, returns)
    before = sum(len(v) for step, v in faulty.items() if step < injection.step)
    return ControlResult(injection, _summary(faulty[injection.step]), _summary(clean.get(injection.step, [])), before)


@dataclass
class HiCacheRun:
    """One layout's clean runs through the host tier, with and without the sidecar, and each fault's control."""

    layout: str
    host_pool: str  # the host pool class the runtime found
    with_sidecar: Any  # matrix.CleanResult
    without_sidecar: Any
    loaded_back: int  # tokens loaded back from the host in the clean run (the same in the run without the sidecar)
    controls: dict  # fault name -> ControlResult


def run_layout(bench, faults: list, steps: int, seed: int) -> HiCacheRun:
    """``bench``: the matrix's bench of a HiCache engine (its sibling for these faults)."""
    from canary_instrument.runtime.features.hicache import unwrap

    # Fresh engines for both: the same steps, whatever runs the matrix's engine made before.
    followed = bench.fresh()
    with_sidecar = followed.clean_run(steps, seed, ReturningWorkload)
    loaded = followed.engine.scheduler.tree_cache.loaded_back_tokens
    plain = bench.fresh()
    unwrap(host_pool(plain.engine))
    without = plain.clean_run(steps, seed, ReturningWorkload)
    controls = {fault.name: control_trial(bench.fresh, fault, seed) for fault in faults}
    return HiCacheRun(bench.variant.layout, type(host_pool(bench.engine)).__name__, with_sidecar, without, loaded,
                      controls)
