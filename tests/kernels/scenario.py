"""Randomised canary pools in a consistent state, built from the pure-Python hash spec.

A scenario is one forward step of a batch: every request's prefix rows are what earlier
passes would have left (chain links, fingerprints, SWA mappings inside the window), and the
plan asks to write ``extend`` new tokens per request. The batch is padded to ``max_bs`` rows
the way a CUDA graph pads it: padding rows have req-pool index 0 and junk lengths, and their
tokens sit in ``input_ids`` after the real ones. Expected tokens come as the runtime provides
them: on a target (``token_offset`` 0) the sampled token of each request's first new position,
checked by the post-forward pass; on a draft worker (``token_offset`` 1) the target's canary
rows, checked by the pre-forward pass below ``prefix - target_margin``. Tests mutate the
scenario to inject faults.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import torch

from canary_instrument.runtime.passes import hashing
from canary_instrument.runtime.passes.layers import attach_layers
from canary_instrument.runtime.passes.state import (
    GROUP_FULL,
    GROUP_SWA,
    HALF_K,
    HALF_V,
    CanaryGroup,
    CanaryState,
    PlanInputs,
)

GARBAGE = -0x5A5A5A5A5A5A5A5B


@dataclass
class Request:
    pool_index: int
    tokens: list[int]  # target-order token ids [0, prefix + extend + 1)
    prefix: int
    extend: int
    full_slots: list[int] = field(default_factory=list)  # [0, prefix + extend)


@dataclass
class Scenario:
    state: CanaryState
    plan: PlanInputs
    input_ids: torch.Tensor
    requests: list[Request]

    def clone(self) -> "Scenario":
        return copy.deepcopy(self)


def group_specs(layout: str, v_half: bool) -> list[tuple[int, int]]:
    halves = [HALF_K, HALF_V] if v_half and layout != "mla" else [HALF_K]
    groups = [GROUP_FULL, GROUP_SWA] if layout == "swa" else [GROUP_FULL]
    return [(g, h) for g in groups for h in halves]


def make_scenario(
    layout: str = "mha",
    realkv: str = "none",
    v_half: bool = True,
    *,
    seed: int = 0,
    num_reqs: int = 4,
    max_bs: int = 6,
    max_prefix: int = 40,
    max_extend: int = 6,
    extend_lens: list[int] | None = None,
    prefix_lens: list[int] | None = None,
    token_offset: int = 0,
    swa_window: int = 8,
    share_prefix: bool = True,
    kv_words: int = 6,
    ring_size: int = 256,
    full_slots: int = 1024,
    swa_slots: int = 512,
    max_context: int = 96,
    expected_tokens: bool = True,
    target_margin: int = 1,
    pool_rows: int = 0,
    unfingerprinted: float = 0.0,
    layers: int = 1,
    device: str = "cpu",
    same_history: bool = False,
    layerless_full: bool = False,
) -> Scenario:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    max_reqs = max(max_bs + 3, pool_rows)  # req-pool capacity; sglang's default is 2049-4097 rows
    pools = rng.sample(range(1, max_reqs), num_reqs)  # req-pool row 0 is the padding row
    requests: list[Request] = []
    for r in range(num_reqs):
        prefix = prefix_lens[r] if prefix_lens else rng.randint(0, max_prefix)
        extend = extend_lens[r] if extend_lens else rng.randint(0, max_extend)
        tokens = [rng.randrange(0, 128_000) for _ in range(prefix + extend + 1)]
        if same_history and requests:  # request 0's tokens, as far as they go (the same history, other slots)
            shared = min(len(tokens), len(requests[0].tokens))
            tokens[:shared] = requests[0].tokens[:shared]
        requests.append(Request(pools[r], tokens, prefix, extend))

    free = list(range(1, full_slots))
    rng.shuffle(free)
    for r, req in enumerate(requests):
        shared = 0
        if share_prefix and r > 0 and requests[0].prefix > 0 and req.prefix > 0:
            # Radix-cache sharing: same leading tokens, same slots as request 0.
            shared = rng.randint(1, min(requests[0].prefix, req.prefix))
            req.tokens[:shared] = requests[0].tokens[:shared]
            if token_offset and shared < len(req.tokens):
                # The draft row at shared-1 holds token `shared`; keep the shared rows identical.
                req.tokens[shared] = requests[0].tokens[shared]
        req.full_slots = requests[0].full_slots[:shared] + [free.pop() for _ in range(req.prefix + req.extend - shared)]

    groups_spec = group_specs(layout, v_half)
    req_to_token = torch.randint(0, full_slots, (max_reqs, max_context), dtype=torch.int32, generator=gen)
    mapping = torch.zeros(full_slots, dtype=torch.int64)
    if layout == "swa":
        swa_free = list(range(1, swa_slots))
        rng.shuffle(swa_free)
        mapped: dict[int, int] = {}
        for req in requests:
            lo = max(0, req.prefix - swa_window)
            for p in range(lo, req.prefix + req.extend):
                s = req.full_slots[p]
                if s not in mapped:
                    mapped[s] = swa_free.pop()
                mapping[s] = mapped[s]
    sampled = torch.full((max_reqs,), -1, dtype=torch.int32)
    target_rows = torch.randint(-(2**62), 2**62, (full_slots, 4), dtype=torch.int64, generator=gen)
    for req in requests:
        req_to_token[req.pool_index, : len(req.full_slots)] = torch.tensor(req.full_slots, dtype=torch.int32)
        if token_offset:
            # The target's rows of positions [1, prefix + extend): target order, token p at position p.
            for p in range(1, req.prefix + req.extend):
                target_rows[req.full_slots[p], 0] = req.tokens[p]
        elif req.extend:
            sampled[req.pool_index] = req.tokens[req.prefix]  # what the sampler produced for the first new position

    groups = []
    for g, h in groups_spec:
        n = swa_slots if g == GROUP_SWA else full_slots
        rows = torch.randint(-(2**62), 2**62, (n, 4), dtype=torch.int64, generator=gen)
        group = CanaryGroup(group=g, half=h, rows=rows)
        if layerless_full and g == GROUP_FULL:
            # An SWA pool whose full sub-pool has no layers (runtime.setup.pools): one zero row read at every slot.
            group.holds_kv = False
            if realkv != "none":
                attach_layers(group, [torch.zeros((1, kv_words), dtype=torch.int64).expand(n, kv_words)])
        elif realkv != "none":
            attach_layers(group, [torch.randint(-(2**62), 2**62, (n, kv_words), dtype=torch.int64, generator=gen)
                                  for _ in range(layers)])
        groups.append(group)

    for req in requests:
        row_tokens = req.tokens[token_offset : token_offset + req.prefix]
        links = hashing.chain_int(row_tokens)
        for grp in groups:
            lo = max(0, req.prefix - swa_window) if grp.group == GROUP_SWA else 0
            for p in range(lo, req.prefix):
                s = req.full_slots[p]
                if grp.group == GROUP_SWA:
                    s = int(mapping[s])
                fps = [0] * layers
                if grp.kv_words is not None and rng.random() >= unfingerprinted:
                    n_words = 2 if realkv == "partial" else grp.kv_words.shape[1]
                    fps = [hashing.fingerprint_int([w & hashing.U64 for w in kv[s, :n_words].tolist()])
                           for kv in grp.kv_layers]
                grp.rows[s] = torch.tensor([row_tokens[p], p, hashing.as_signed(links[p]), hashing.as_signed(fps[0])])
                if grp.kv_layers and layers > 1:
                    grp.layer_fingerprints[s] = torch.tensor([hashing.as_signed(f) for f in fps[1:]])

    def padded(values, dtype, junk):
        out = torch.tensor([junk() for _ in range(max_bs)], dtype=dtype)
        out[: len(values)] = torch.tensor(values, dtype=dtype)
        return out

    extend_lens = padded([q.extend for q in requests], torch.int32, lambda: rng.randrange(max_extend + 1))
    new_tokens = []
    for req in requests:
        new_tokens += req.tokens[token_offset + req.prefix : token_offset + req.prefix + req.extend]
    # Graph padding rows' tokens follow the real ones (their junk extend lengths), then slack.
    new_tokens += [rng.randrange(0, 128_000) for _ in range(int(extend_lens[num_reqs:].sum()) + 3)]

    plan = PlanInputs(
        num_reqs=max_bs,
        req_pool_indices=padded([q.pool_index for q in requests], torch.int64, lambda: 0),
        prefix_lens=padded([q.prefix for q in requests], torch.int32, lambda: rng.randrange(max_prefix + 1)),
        extend_lens=extend_lens,
        enabled=torch.tensor([1], dtype=torch.int32),
        check_sampled=expected_tokens and not token_offset,
        target_margin=target_margin if token_offset else -1,
    )
    state = CanaryState(
        layout=layout,
        realkv=realkv,
        groups=groups,
        req_to_token=req_to_token,
        token_offset=token_offset,
        sampled_tokens=sampled if expected_tokens and not token_offset else None,
        target_rows=target_rows if expected_tokens and token_offset else None,
        swa_mapping=mapping if layout == "swa" else None,
        swa_window=swa_window if layout == "swa" else 0,
        ring=torch.zeros((ring_size, 8), dtype=torch.int64),
        ring_count=torch.zeros(1, dtype=torch.int64),
        counters=torch.zeros(4, dtype=torch.int64),
        group_verified=torch.zeros(2, dtype=torch.int64),
        # Each request is somewhere in its layer rotation.
        layer_cursor=torch.randint(0, 1 << 20, (max_reqs,), dtype=torch.int64, generator=gen),
    )
    scenario = Scenario(state, plan, torch.tensor(new_tokens, dtype=torch.int64), requests)
    return to_device(scenario, device)


def to_device(scenario: Scenario, device: str) -> Scenario:
    def move(obj):
        for name, value in vars(obj).items():
            if isinstance(value, torch.Tensor):
                setattr(obj, name, value.to(device))

    move(scenario.state)
    move(scenario.plan)
    for grp in scenario.state.groups:
        move(grp)
        if grp.kv_layers:
            grp.kv_layers = [kv.to(device) for kv in grp.kv_layers]
            grp.kv_words = grp.kv_layers[0]
    scenario.input_ids = scenario.input_ids.to(device)
    return scenario


def violations(state: CanaryState) -> list[tuple[int, ...]]:
    """The ring's records as a sorted list (kernels append in nondeterministic order)."""
    count = int(state.ring_count[0])
    if count > state.ring.shape[0]:
        raise ValueError(f"{count} violations overflowed the {state.ring.shape[0]}-record test ring")
    return sorted(tuple(r) for r in state.ring[:count].cpu().tolist())
