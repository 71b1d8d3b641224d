"""Fault injectors: the KV-cache corruptions real bugs cause, applied to a running engine through its hooks.

Each injector waits at one debug-hook point of the engine (`batch_built`,
`draft_extend_batch`, `step_end`) until it finds a target, corrupts it once, and records
what it did and which canary reasons must report it. An injector that finds nothing it
could actually corrupt (say, two requests whose next tokens are equal) waits for the
next opportunity instead of counting a no-op as a fault. The engine source is never edited.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

# Reason names as the runtime reports them (canary_instrument.runtime.state.REASON_NAMES).
POSITION, LINK, FINGERPRINT, TOKEN, SWA_UNMAPPED = "position", "link", "fingerprint", "token", "swa_unmapped"

PARTIAL_FINGERPRINT_BYTES = 16


@dataclass(frozen=True)
class Injection:
    step: int  # 1-based scheduler step during (batch hooks) or after (step_end) which the corruption happened
    description: str
    expected_reasons: frozenset


@dataclass(frozen=True)
class Fault:
    name: str
    title: str
    point: str  # debug-hook point the injector waits at
    inject: Callable[..., Optional[tuple[str, frozenset]]]
    needs_eagle: bool = False
    needs_swa: bool = False

    def applies(self, layout: str, eagle: bool) -> bool:
        return (eagle or not self.needs_eagle) and (layout == "swa" or not self.needs_swa)

    def arm(self, engine: Any, rng: random.Random) -> "ArmedFault":
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

    def disarm(self):
        if self._remove is not None:
            self._remove()
            self._remove = None


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


def _layer0_rows(pool, group: str) -> list[tuple[str, torch.Tensor]]:
    """(name, layer-0 buffer) of each fingerprinted half in `group` ("full" or "swa") of a pool."""
    if hasattr(pool, "full_kv_pool"):
        pool = pool.full_kv_pool if group == "full" else pool.swa_kv_pool
    if hasattr(pool, "kv_buffer"):
        return [("latent", pool.kv_buffer[0])]
    return [("k", pool.k_buffer[0]), ("v", pool.v_buffer[0])]


def _flip_bit(buffer: torch.Tensor, slot: int, byte_limit: Optional[int], rng: random.Random) -> tuple[int, int]:
    row = buffer[slot].reshape(-1).view(torch.uint8)
    limit = row.numel() if byte_limit is None else min(byte_limit, row.numel())
    byte, bit = rng.randrange(limit), rng.randrange(8)
    row[byte] ^= 1 << bit
    return byte, bit


def _byte_limit(engine) -> Optional[int]:
    return PARTIAL_FINGERPRINT_BYTES if engine.server_args.kv_canary_real_kv == "partial" else None


def _corrupt_kv(engine, rng, pick_position: Callable) -> Optional[tuple[str, frozenset]]:
    """Flip one fingerprinted bit in a cached position of a running request, in some runner's pool."""
    reqs = _candidates(engine)
    if not reqs:
        return None
    req = rng.choice(reqs)
    position = pick_position(req)
    runner = rng.choice(engine.model_runners)
    pool = runner.token_to_kv_pool
    slot = _slot(engine, req, position)
    group = "full"
    if hasattr(pool, "full_kv_pool") and rng.random() < 0.5 and position >= _window_start(engine, req):
        group, slot = "swa", int(pool.full_to_swa_index_mapping[slot])
    name, buffer = rng.choice(_layer0_rows(pool, group))
    byte, bit = _flip_bit(buffer, slot, _byte_limit(engine), rng)
    where = "draft" if runner.is_draft_worker else "target"
    return (
        f"{where} {group} {name} slot {slot} (req {req.rid} position {position}): byte {byte} bit {bit} flipped",
        {FINGERPRINT},
    )


# ---------------------------------------------------------------------- injectors


def remap_req_to_token(engine, rng, **_) -> Optional[tuple[str, frozenset]]:
    """req_to_token[r, p] now names a slot of another request at another position."""
    reqs = _candidates(engine, 2)
    if len(reqs) < 2:
        return None
    victim = rng.choice(reqs)
    other = rng.choice([r for r in reqs if r is not victim])
    position = rng.randrange(victim.cached_len)
    choices = [q for q in range(other.cached_len) if q != position]
    if not choices:
        return None
    other_position = rng.choice(choices)
    old, new = _slot(engine, victim, position), _slot(engine, other, other_position)
    engine.scheduler.req_to_token_pool.req_to_token[victim.req_pool_idx, position] = new
    return (
        f"req {victim.rid} position {position}: slot {old} -> {new} (req {other.rid} position {other_position})",
        {POSITION},
    )


def use_after_free(engine, rng, **_) -> Optional[tuple[str, frozenset]]:
    """An allocator bug: a slot still referenced is freed, and the next allocation reuses it."""
    reqs = _candidates(engine, 2)
    if not reqs:
        return None
    req = rng.choice(reqs)
    position = rng.randrange(req.cached_len)
    slot = _slot(engine, req, position)
    engine.scheduler.allocator.free(torch.tensor([slot], dtype=torch.int64, device=engine.scheduler.device))
    return f"req {req.rid} position {position}: slot {slot} freed while in use", {POSITION, LINK}


def realkv_flip(engine, rng, **_) -> Optional[tuple[str, frozenset]]:
    """A bit of real KV flips in a slot some request still reads (memory corruption, a stray write)."""
    return _corrupt_kv(engine, rng, lambda req: rng.randrange(req.cached_len))


def kv_flip_after_write(engine, rng, batch=None, **_) -> Optional[tuple[str, frozenset]]:
    """A bit flips in KV the last forward just wrote (a corrupted transfer, e.g. prefill -> decode)."""
    written = {id(r) for r in batch.reqs} if batch is not None else set()
    reqs = [r for r in _candidates(engine) if id(r) in written]
    if not reqs:
        return None
    return _corrupt_kv(engine, rng, lambda req: req.cached_len - 1)


def token_swap(engine, rng, forward_batch=None, **_) -> Optional[tuple[str, frozenset]]:
    """Two requests' next input tokens are exchanged while the batch is assembled."""
    mode = forward_batch.forward_mode
    if not (mode.is_decode() or mode.is_target_verify()):
        return None
    stride = forward_batch.num_tokens_per_req or 1
    firsts = forward_batch.input_ids[::stride].tolist()
    pairs = [(i, j) for i in range(len(firsts)) for j in range(i + 1, len(firsts)) if firsts[i] != firsts[j]]
    if not pairs:
        return None
    i, j = rng.choice(pairs)
    ids = forward_batch.input_ids
    ids[i * stride], ids[j * stride] = firsts[j], firsts[i]
    return f"batch rows {i} and {j}: next tokens {firsts[i]} and {firsts[j]} swapped", {TOKEN}


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


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("remap", "req_to_token entry remapped", "step_end", remap_req_to_token),
        Fault("use_after_free", "slot freed while in use, reused", "step_end", use_after_free),
        Fault("realkv_flip", "real-KV bit flipped in use", "step_end", realkv_flip),
        Fault("kv_flip_after_write", "KV bit flipped after write", "step_end", kv_flip_after_write),
        Fault("token_swap", "two requests' tokens swapped", "batch_built", token_swap),
        Fault("eagle_offset", "EAGLE draft position off by one", "draft_extend_batch", eagle_offset, needs_eagle=True),
        Fault("swa_mapping", "SWA mapping entry corrupted", "step_end", swa_mapping, needs_swa=True),
    )
}
