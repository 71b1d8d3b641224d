"""Fault injectors: the KV-cache corruptions real bugs cause, applied to a running engine.

Most faults are the runtime's own self-test perturbations (``canary_instrument.runtime.perturb``,
the kinds a user switches on in a deployment): the trial arms one on the target model runner's
canary manager at rate 1 with a limit of one injection, and the manager runs it at its hook points.
The faults the perturbations do not model (a slot freed while in use, an EAGLE draft offset, a
corrupted SWA mapping) are injectors of their own that wait at one debug-hook point of the engine
(`draft_extend_batch`, `step_end`). The HiCache faults are the runtime's host-tier kinds, switched on for
the engine's host pool (`demo/hicache_trials.py`). Either way a fault that found nothing it could actually corrupt
(say, two requests whose next tokens are equal) waits for the next opportunity instead of counting
a no-op as a fault. The engine source is never edited.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch

from canary_instrument.demo.injected import Injection

# Reason names as the runtime reports them (canary_instrument.runtime.passes.state.REASON_NAMES).
POSITION, LINK, FINGERPRINT, TOKEN, SWA_UNMAPPED = "position", "link", "fingerprint", "token", "swa_unmapped"
IDENTITY, WRITE_SLOT, FREED = "identity", "write_slot", "freed"
UNWRITTEN, ROW_BITS = "unwritten", "row_bits"
ORACLE = "oracle"


@dataclass(frozen=True)
class Fault:
    name: str
    title: str
    point: str  # debug-hook point the injector waits at; "manager" for a perturbation
    inject: Optional[Callable[..., Optional[tuple[str, frozenset]]]] = None
    needs_eagle: bool = False
    needs_swa: bool = False
    perturbation: Optional[str] = None  # a runtime perturbation kind (runtime/perturb), run by the manager
    expected: frozenset = frozenset()  # the reasons that report a perturbation
    without_eagle: bool = False
    # What the engine must be built with for this fault: server args and environment variables, as
    # (name, value) pairs; the bench runs such a fault on an engine of its own (matrix.EngineBench).
    engine_args: tuple = ()
    environ: tuple = ()
    hicache_kind: Optional[str] = None  # a HiCache host-tier kind (runtime/perturb/hicache_faults.py), on the host pool
    max_wait: Optional[int] = None  # steps a trial waits at least for the injection and its report

    def applies(self, layout: str, eagle: bool) -> bool:
        return ((eagle or not self.needs_eagle) and not (eagle and self.without_eagle)
                and (layout == "swa" or not self.needs_swa) and not self.refused(layout, eagle))

    def refused(self, layout: str, eagle: bool) -> bool:
        """The runtime refuses what this fault needs on such an engine (HiCache of an SWA pool)."""
        return self.hicache_kind is not None and layout == "swa" and not eagle

    def arm(self, engine: Any, rng: random.Random):
        if self.perturbation is not None:
            return ArmedPerturbation(self, engine, rng)
        if self.hicache_kind is not None:
            from canary_instrument.demo.hicache_trials import ArmedHiCacheFault

            return ArmedHiCacheFault(self, engine, rng)
        return ArmedFault(self, engine, rng)


class ArmedFault:
    """One pending injection of `fault` into `engine`; fires at most once."""

    def __init__(self, fault: Fault, engine: Any, rng: random.Random):
        self.fault = fault
        self.engine = engine
        self.rng = rng
        self.injection: Optional[Injection] = None
        self._remove = engine.hooks.register(fault.point, self._on_hook)

    def _on_hook(self, **kwargs):
        if self.injection is not None:
            return
        done = self.fault.inject(self.engine, self.rng, **kwargs)
        if done is not None:
            description, expected = done
            # Steps are numbered from 1; step_end runs after the scheduler counted the step.
            step = self.engine.scheduler.forward_ct + (0 if self.fault.point == "step_end" else 1)
            self.injection = Injection(step, description, frozenset(expected))
            self.disarm()

    def poll(self, violations: tuple = ()):
        """Nothing to collect: the hook records the injection as it happens."""

    def disarm(self):
        if self._remove is not None:
            self._remove()
            self._remove = None


class ArmedPerturbation:
    """One pending perturbation of the target's canary manager: rate 1, at most one injection, no warm-up.

    ``poll()`` after each step collects the injection (its line is complete once the step's flush
    read its device facts); one that changed nothing (``applied=0``) re-arms the perturbation with the
    next seed of its own sequence, so that a re-armed kind draws anew (its group, say) instead of
    repeating the draw that found nothing to change."""

    def __init__(self, fault: Fault, engine: Any, rng: random.Random):
        from canary_instrument.runtime.perturb import PerturbSettings

        self.fault = fault
        self.engine = engine
        self.manager = engine.model_runner.canary_manager
        if self.manager is None:
            raise RuntimeError("perturbation faults need the target model runner's canary manager (kv_canary on)")
        self.settings = PerturbSettings(rates=((fault.perturbation, 1.0),), seed=rng.randrange(1 << 30),
                                        warmup_steps=0)
        self._seeds = random.Random(self.settings.seed)  # the re-arms' seeds (the workload's rng is left alone)
        self.injection: Optional[Injection] = None
        self.perturbed = None  # the runtime's own record of it (``perturb.Injection``)
        self._arm()

    def _arm(self):
        from canary_instrument.runtime.perturb.perturber import Perturber

        self.manager.perturber = Perturber(self.settings, self.manager.state, limit=1)

    def poll(self, violations: tuple = ()):
        """Collect the step's injection; ``violations``: what the step reported."""
        perturber = self.manager.perturber
        if self.injection is not None or perturber is None:
            return
        for done in perturber.drain():
            if not done.applied or self._unreadable(done, violations):
                # It changed nothing (equal tokens, an SWA slot out of the window), or nothing can read what it
                # changed: draw again.
                self.settings = replace(self.settings, seed=self._seeds.randrange(1 << 30))
                self._arm()
                continue
            self.perturbed = done
            # It happened during the step just run (before or after its forward, or at its end).
            self.injection = Injection(self.engine.scheduler.forward_ct, done.format(), self.fault.expected)
            self.disarm()

    def _unreadable(self, done: Any, violations) -> bool:
        """A corruption left in its slot that no one can read any more: the step reported nothing of it, and
        no running request and no prefix-cache node holds the slot (its request finished in the step and
        the slot was freed, say as a duplicate of a cached prefix; the next owner writes it anew). Like the
        other faults' candidates (`_candidates`), a corruption nobody reads again is not a trial."""
        # (An SWA-group injection names its SWA slot, which the table does not hold: left to its trial.)
        if done.kind not in _LASTING or done.group == "swa":
            return False
        if any(set(v.reasons) & self.fault.expected for v in violations):
            return False
        slot = done.slot
        scheduler = self.engine.scheduler
        table = scheduler.req_to_token_pool.req_to_token
        holders = list(scheduler.running) + ([scheduler.chunked_req] if scheduler.chunked_req is not None else [])
        for req in holders:
            if (table[req.req_pool_idx, : max(req.cached_len, req.kv_allocated_len)] == slot).any():
                return False
        return not any(getattr(node, "slot", None) == slot for node in scheduler.tree_cache._nodes())

    def disarm(self):
        if self.manager.perturber is not None:
            self.manager.perturber.restore()
            self.manager.perturber = None


# Perturbation kinds whose corruption stays in its slot after the step (the others are undone after their forward).
_LASTING = frozenset({"real_kv_layer", "real_kv_post_forward", "real_kv_unused_cache", "fingerprint_zeroed",
                      "row_high_bit"})


# ---------------------------------------------------------------------- helpers


def _candidates(engine, min_cached: int = 1):
    """Running requests with at least `min_cached` cached positions that will run at least two more steps,
    so the corruption is read again (a corrupted request that finishes is never read, and never reported)."""
    per_step = engine.server_args.speculative_num_steps + 1 if engine.server_args.is_eagle else 1
    return [
        r
        for r in engine.scheduler.running
        if r.cached_len >= min_cached and r.max_new_tokens - len(r.output_ids) > 2 * per_step
    ]


def _slot(engine, req, position: int) -> int:
    return int(engine.scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, position])


def _window_start(engine, req) -> int:
    return max(0, req.cached_len - engine.scheduler.sliding_window)


# ---------------------------------------------------------------------- injectors


def use_after_free(engine, rng, **_) -> Optional[tuple[str, frozenset]]:
    """An allocator bug: a slot still referenced is freed, and the next allocation reuses it."""
    reqs = _candidates(engine, 2)
    if not reqs:
        return None
    req = rng.choice(reqs)
    position = rng.randrange(req.cached_len)
    slot = _slot(engine, req, position)
    engine.scheduler.allocator.free(torch.tensor([slot], dtype=torch.int64, device=engine.scheduler.device))
    return f"req {req.rid} position {position}: slot {slot} freed while in use", {POSITION, LINK, FREED}


def eagle_offset(engine, rng, forward_batch=None, batch=None, **_) -> Optional[tuple[str, frozenset]]:
    """The EAGLE draft-extend forgets to rotate its inputs: draft slot p gets token p, not p + 1."""
    ids = forward_batch.input_ids
    per_step = engine.server_args.speculative_num_steps + 1
    changed, start = 0, 0
    for req, prefix, length in zip(batch.reqs, forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu):
        known = req.all_token_ids  # token p at position p, for every position the scheduler has committed
        if req.max_new_tokens - len(req.output_ids) <= 2 * per_step:
            # Finishing soon: its draft rows are checked against the target's by the request's next
            # draft forwards, which it may never run (as _candidates() rules out for the other faults).
            start += length
            continue
        for j in range(length):
            position = prefix + j
            if position < len(known) and int(ids[start + j]) != known[position]:
                ids[start + j] = known[position]
                changed += 1
        start += length
    if not changed:
        return None
    return f"draft-extend of {forward_batch.batch_size} requests: {changed} input ids not rotated", {TOKEN}


def swa_mapping(engine, rng, **_) -> Optional[tuple[str, frozenset]]:
    """full_to_swa_index_mapping of an in-window slot is zeroed or pointed at another request's SWA slot."""
    scheduler = engine.scheduler
    mapping = scheduler.allocator.full_to_swa_index_mapping
    reqs = _candidates(engine, 2)
    if not reqs:
        return None
    req = rng.choice(reqs)
    position = rng.randrange(_window_start(engine, req), req.cached_len)
    slot = _slot(engine, req, position)
    if int(mapping[slot]) == 0:
        return None
    if rng.random() < 0.5:
        mapping[slot] = 0
        return f"req {req.rid} position {position}: full slot {slot} unmapped from the SWA pool", {SWA_UNMAPPED}
    others = [
        (r, q) for r in reqs for q in range(_window_start(engine, r), r.cached_len) if q != position
    ]
    other, other_position = rng.choice(others)
    target = int(mapping[_slot(engine, other, other_position)])
    if target == 0:
        return None
    old = int(mapping[slot])
    mapping[slot] = target
    return (
        f"req {req.rid} position {position}: SWA slot {old} -> {target} (req {other.rid} position {other_position})",
        {POSITION},
    )


def mixed_decode_token(engine, rng, forward_batch=None, **_) -> Optional[tuple[str, frozenset]]:
    """A request decoding in a mixed batch (its next token riding in a chunked prefill) is fed a wrong input
    token: a scheduler bug on the mixed path. The sampled-token check reads pure decodes only, and the row
    written from the wrong token chains consistently, so only the token oracle's input check sees it."""
    if forward_batch is None or not forward_batch.forward_mode.is_mixed():
        return None
    oracle = getattr(engine.model_runner.canary_manager, "token_oracle", None)  # None: the control run
    lens = list(forward_batch.extend_seq_lens_cpu)
    rows = forward_batch.req_pool_indices.tolist()
    riding = {r.req_pool_idx: r for r in engine.scheduler.running}
    # The reference engine's req pool hands out rows without their requests, so the oracle learns where a
    # request's sampled tokens start from its first pure decode; one riding before that is not checked yet.
    candidates = [i for i, (row, n) in enumerate(zip(rows, lens))
                  if row in riding and n == 1 and (oracle is None or int(oracle.prompt_len[row]) >= 0)]
    if not candidates:
        return None
    i = rng.choice(candidates)
    at = sum(lens[:i])
    vocab = engine.server_args.vocab_size
    old = int(forward_batch.input_ids[at])
    new = (old + 1 + rng.randrange(vocab - 1)) % vocab
    forward_batch.input_ids[at] = new
    position = int(forward_batch.positions[at])
    return f"req {riding[rows[i]].rid} position {position}: input token {old} -> {new} in a mixed batch", {ORACLE}


# The host tier at work: a device pool a third of the matrix's, so prefixes leave the device within a few
# steps and come back from the host on the next hit.
HICACHE_ENGINE_ARGS = (("enable_hierarchical_cache", True), ("max_total_tokens", 256))


def _hicache(kind: str, title: str, expected: set) -> Fault:
    """A fault in the host tier, on an engine with HiCache; the reference engine has no host tier with EAGLE."""
    # A flipped host copy is seen only once a prefix hit loads that slot back: that can take a while.
    return Fault(kind, title, "host_pool", hicache_kind=kind, expected=frozenset(expected), without_eagle=True,
                 engine_args=HICACHE_ENGINE_ARGS, max_wait=60)


def _perturbation(name: str, title: str, kind: str, expected: set) -> Fault:
    return Fault(name, title, "manager", perturbation=kind, expected=frozenset(expected))


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        _perturbation("remap", "req_to_token entry remapped", "req_to_token", {POSITION, LINK, SWA_UNMAPPED}),
        Fault("use_after_free", "slot freed while in use, reused", "step_end", use_after_free),
        _perturbation("realkv_flip", "real-KV bit flipped in use", "real_kv_used", {FINGERPRINT}),
        _perturbation("kv_flip_after_write", "KV bit flipped after write", "real_kv_post_forward", {FINGERPRINT}),
        _perturbation("idle_cache_flip", "cached KV bit flipped while idle", "real_kv_unused_cache", {FINGERPRINT}),
        _perturbation("token_swap", "two requests' tokens swapped", "next_token_swap", {TOKEN}),
        _perturbation("req_row_swap", "two requests' rows swapped", "req_row_swap", {IDENTITY}),
        _perturbation("write_slot", "KV written to a wrong slot", "write_slot", {WRITE_SLOT}),
        _perturbation("premature_free", "slot freed while read", "premature_free", {FREED}),
        _perturbation("layer_flip", "KV bit flipped in any layer", "real_kv_layer", {FINGERPRINT}),
        _perturbation("fingerprint_zeroed", "fingerprint zeroed, KV flipped", "fingerprint_zeroed", {UNWRITTEN}),
        _perturbation("row_high_bit", "row token bit 32-63 flipped", "row_high_bit", {ROW_BITS}),
        Fault("eagle_offset", "EAGLE draft position off by one", "draft_extend_batch", eagle_offset, needs_eagle=True),
        Fault("swa_mapping", "SWA mapping entry corrupted", "step_end", swa_mapping, needs_swa=True),
        Fault("mixed_decode_token", "wrong input token, mixed batch", "batch_built", mixed_decode_token,
              without_eagle=True, engine_args=(("enable_mixed_chunk", True),),
              environ=(("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "1"),)),
        _hicache("hicache_host_copy", "HiCache host copy corrupted", {FINGERPRINT}),
        _hicache("hicache_load_slots", "HiCache load to wrong slots", {POSITION, LINK, FREED}),
    )
}
