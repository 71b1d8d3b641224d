"""What every perturbation kind shares: the context it acts in, the plan it returns, and device helpers.

A kind picks its target from host-known data (batch facts, the cache's structure) with its own
seeded generator, then corrupts it with device ops only: indices it does not know on the host
(a request's req-pool index, a slot) stay device tensors, and what they turned out to be is read
back later (``facts.FactReadback``). Where the host does not know the range to draw from (a
target verify whose prefix only the device holds), the generator draws the choice (a fraction, an
order) and device ops turn it into the target (``device_row``, ``device_position``); the position
hit is then a device fact too (``position``, overriding ``Planned.position`` in the log line).
No kind reads a device value on the host.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

GROUP_NAMES = {0: "full", 1: "swa"}  # as violation lines name them
HALF_NAMES = {0: "k", 1: "v"}


@dataclass
class Planned:
    """One injection done on the device; device facts (one-element tensors) complete its log line."""

    kind: str
    step: int
    position: int  # host-known position (else a device fact "position"; -1 here)
    group: str = "-"
    half: str = "-"
    slot: int = -1  # host-known slot, when it is (else a device fact "slot")
    req: int = -1  # host-known req-pool index, when it is (else a device fact "req")
    extra: tuple = ()  # host-known kind-specific fields ((name, int), ...)
    device: dict = field(default_factory=dict)  # name -> one-element device tensor: slot, req, applied, extras
    undo: Optional[Callable[[], None]] = None  # restores what was corrupted (called after the forward read it)
    # (name, device fact, host table): a logged field looked up in a host table by a device fact, which
    # itself is not logged (next_token_swap's partner position, by the partner's batch row).
    derived: tuple = ()
    # (node, index): the prefix-cache node whose slot ``index`` was corrupted, for the perturber to watch
    # (``left_cache``); None for any other target.
    watch: Optional[tuple] = None


@dataclass
class KindContext:
    """What a kind may touch: the manager's canary state (engine tensors included) and its generator."""

    state: Any  # CanaryState: req_to_token, groups (canary rows, real-KV views), SWA mapping and window
    rng: random.Random
    target_group: str  # any | full | swa


def fingerprinted_bytes(state: Any) -> int:
    """How many leading bytes of layer 0's KV row the fingerprint covers (a flip beyond them goes unseen)."""
    from canary_instrument.codegen.specs import PARTIAL_WORDS

    words = state.groups[0].kv_words.shape[1]
    return 8 * (min(PARTIAL_WORDS, words) if state.realkv == "partial" else words)


def pick_group(ctx: KindContext, swa_ok: bool = True) -> Any:
    """A (group, half) to flip in, uniformly among those the target-group setting allows."""
    want = {"any": (0, 1), "full": (0,), "swa": (1,)}[ctx.target_group]
    groups = [g for g in ctx.state.groups if g.group in want and (swa_ok or g.group == 0) and g.holds_kv]
    return ctx.rng.choice(groups) if groups else None


def host_to_device(values: list[int], device: Any) -> Any:
    """Host ints as a device tensor through pinned memory (a pageable copy would wait for the device)."""
    import torch

    host = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def flip_bit(kv_words: Any, slot: Any, valid: Any, byte: int, bit: int) -> Callable[[], None]:
    """XOR bit ``bit`` of byte ``byte`` of row ``slot`` (a one-element device tensor) where ``valid``;
    returns the undo (the same XOR). Row-wise gather/scatter, so any row stride works."""
    import torch

    rows = kv_words.view(torch.uint8)
    index = torch.where(valid, slot, torch.zeros_like(slot)).reshape(1)
    mask = (valid.reshape(1).to(torch.uint8) << bit)

    def xor() -> None:
        row = rows.index_select(0, index)
        row[:, byte] ^= mask
        rows.index_copy_(0, index, row)

    xor()
    return xor


def device_row(ctx: KindContext, ok: Any) -> tuple[Any, Any]:
    """A batch row where the device bool tensor ``ok`` holds, uniformly among those: the first such row of a
    host-drawn random order (argmax finds the first maximum). Returns (row, valid) one-element int64/bool
    device tensors; valid is False (row arbitrary) when no row is ok."""
    import torch

    order = list(range(ok.shape[0]))
    ctx.rng.shuffle(order)
    order = host_to_device(order, ok.device)
    row = order.index_select(0, ok.index_select(0, order).to(torch.int8).argmax().reshape(1))
    return row, ok.index_select(0, row)


def device_position(ctx: KindContext, low: Any, high: Any) -> tuple[Any, Any]:
    """A position uniform in [low, high) (one-element device int tensors) from a host-drawn fraction, device
    ops only. Returns (position, valid) one-element int64/bool tensors; valid is False (position low) when
    the range is empty."""
    import torch

    low, high = low.reshape(1).to(torch.int64), high.reshape(1).to(torch.int64)
    span = (high - low).clamp(min=0)
    offset = (span.to(torch.float64) * ctx.rng.random()).to(torch.int64)
    # The fraction is below 1, but the product may round up to span itself.
    offset = torch.minimum(offset, (span - 1).clamp(min=0))
    return low + offset, span > 0
