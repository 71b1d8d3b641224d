"""Fault injectors for canary scenarios: each corrupts one prefix entry the way an engine bug would."""

from __future__ import annotations

import random
from dataclasses import dataclass

from canary_instrument.runtime.passes.layers import layer_count, layer_words, store_fingerprint
from canary_instrument.runtime.passes.state import GROUP_SWA

from .scenario import Scenario


@dataclass
class Target:
    group_half: int
    position: int
    req_pool_index: int

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.group_half, self.position, self.req_pool_index)


def _pick(sc: Scenario, rng: random.Random, swa_group: bool = False):
    """A request with a verified prefix and an in-window position p of it (and its full slot)."""
    candidates = [r for r in sc.requests if r.prefix > 0]
    req = rng.choice(candidates)
    lo = max(0, req.prefix - sc.state.swa_window) if swa_group else 0
    p = rng.randrange(lo, req.prefix)
    return req, p, req.full_slots[p]


def _group(sc: Scenario, swa: bool):
    want = GROUP_SWA if swa else 0
    return next(g for g in sc.state.groups if g.group == want)


def remapped_req_to_token(sc, rng):
    req, p, slot = _pick(sc, rng)
    other = next(r for r in sc.requests if r is not req and r.prefix + r.extend > 0) if len(sc.requests) > 1 else req
    q = (p + 1 + rng.randrange(len(other.full_slots) - 1)) % len(other.full_slots) if len(other.full_slots) > 1 else 0
    victim = other.full_slots[q]
    if q == p or victim == slot:
        return None
    sc.state.req_to_token[req.pool_index, p] = victim
    return Target(0, p, req.pool_index)


def wrong_position(sc, rng):
    req, p, slot = _pick(sc, rng)
    sc.state.groups[0].rows[slot, 1] += 1
    return Target(0, p, req.pool_index)


def _checked_layer(sc, req) -> int:
    """The layer this request's next pre-forward pass fingerprints (realkv=partial's rotation)."""
    return int(sc.state.layer_cursor[req.pool_index]) % layer_count(sc.state.groups[0])


def flipped_kv_byte(sc, rng):
    req, p, slot = _pick(sc, rng)
    grp = sc.state.groups[0]
    layer_words(grp, _checked_layer(sc, req))[slot, rng.randrange(2)] ^= 1 << (8 * rng.randrange(8))
    return Target(0, p, req.pool_index)


def zeroed_fingerprint(sc, rng):
    """A zeroing bug clears the stored fingerprint of the layer this pass checks, then the KV under it changes."""
    req, p, slot = _pick(sc, rng)
    grp = sc.state.groups[0]
    layer = _checked_layer(sc, req)
    store_fingerprint(grp, slot, layer, 0)
    layer_words(grp, layer)[slot, 0] ^= 1 << rng.randrange(64)
    return Target(0, p, req.pool_index)


def token_high_bit(sc, rng):
    """A bit of the token word that the chain does not key (32-63) flips."""
    req, p, slot = _pick(sc, rng)
    sc.state.groups[0].rows[slot, 0] ^= 1 << rng.randrange(32, 64)
    return Target(0, p, req.pool_index)


def wrong_token(sc, rng):
    """The token a row holds is not the one the engine's device data says it must be."""
    if sc.state.sampled_tokens is not None:
        # Target: the sampler produced another token for the request's first new position.
        req = rng.choice([r for r in sc.requests if r.extend > 0])
        sc.state.sampled_tokens[req.pool_index] += 1
        return Target(0, req.prefix, req.pool_index)
    # Draft worker: the target's row of position p + 1 holds another token than draft row p.
    margin = sc.plan.target_margin
    req = rng.choice([r for r in sc.requests if r.prefix - margin > 0])
    p = rng.randrange(req.prefix - margin)
    sc.state.target_rows[req.full_slots[p + 1], 0] += 1
    return Target(0, p + 1, req.pool_index)  # reported at the target's row, where the token is wrong


def bad_swa_mapping(sc, rng):
    if sc.state.layout != "swa":
        return None
    req, p, slot = _pick(sc, rng, swa_group=True)
    sc.state.swa_mapping[slot] = 0
    return Target(GROUP_SWA * 2 + _group(sc, True).half, p, req.pool_index)


def padding_slot(sc, rng):
    req, p, slot = _pick(sc, rng)
    sc.state.req_to_token[req.pool_index, p] = 0
    return Target(0, p, req.pool_index)


def broken_link(sc, rng):
    req, p, slot = _pick(sc, rng)
    sc.state.groups[0].rows[slot, 2] ^= 1 << rng.randrange(64)
    return Target(0, p, req.pool_index)


FAULTS = {f.__name__: f for f in (remapped_req_to_token, wrong_position, flipped_kv_byte, wrong_token,
                                  bad_swa_mapping, padding_slot, broken_link, zeroed_fingerprint, token_high_bit)}


def inject(sc: Scenario, fault: str, seed: int = 0):
    return FAULTS[fault](sc, random.Random(seed))
