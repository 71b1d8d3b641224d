"""A ModelRunner-shaped object around sglang 0.5.20's REAL pools and allocators, and a scheduler that
drives it with REAL ``ForwardBatch`` objects.

Real classes: ``ReqToTokenPool`` (its row 0 is never handed out), ``MHATokenToKVPool``,
``MLATokenToKVPool``, ``SWAKVPool`` with ``SWATokenToKVPoolAllocator`` (which owns
``full_to_swa_index_mapping`` and registers it on the pool), ``TokenToKVPoolAllocator``,
``RadixAttention`` layers, ``KVWriteLoc``, ``ForwardMode`` and ``ForwardBatch``. The model writes
its KV through the pools' own ``set_kv_buffer``.

Built by hand, because sglang's path to them needs GPU-side pieces: ``ForwardBatch`` objects are
built directly with the fields ``ForwardBatch.init_new`` sets from a ``ScheduleBatch`` (init_new
also needs a scheduler batch, an attention backend's index translator, LoRA and n-gram managers);
extend positions come from sglang's own ``compute_position_torch``. The scheduler below does what
sglang's scheduler does for these batches (rows, slots, ``req_to_token``, SWA window eviction
through the allocator's ``free_swa``), in a few lines.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import torch

from canary_instrument.runtime import canary_context, install_canary

HEADS, HEAD_DIM, LAYERS, VOCAB = 2, 8, 2, 97
KV_LORA_RANK, ROPE_DIM = 16, 8
DTYPE = torch.bfloat16


class TinyModel(torch.nn.Module):
    """Real ``RadixAttention`` layers; each forward writes a KV row per new token into the real pool, as attention
    does, and returns logits whose argmax is a fixed function of (token, position)."""

    def __init__(self, sg, pool, layout: str, window: Optional[int], swa_mapping=None):
        super().__init__()
        self.pool = pool
        self.layout = layout
        attention = sg.radix_attention.RadixAttention
        # "mtp": a multi-layer EAGLE draft's one MTP layer, a sliding-window one.
        count = 1 if layout == "mtp" else LAYERS
        self.layers = torch.nn.ModuleList(
            attention(num_heads=HEADS, head_dim=HEAD_DIM, scaling=1.0, num_kv_heads=HEADS, layer_id=i,
                      sliding_window_size=window if (layout == "swa" and i == 1) or layout == "mtp" else -1)
            for i in range(count)
        )
        self._write_loc = sg.memory_pool.KVWriteLoc
        # The full-to-SWA mapping the attention backend translates with, when the pool has none registered (a draft
        # pool: sglang's SWA allocator registers its mapping on the target's pool only).
        self._swa_mapping = swa_mapping
        self.forward_calls = 0

    def forward(self, input_ids, positions, forward_batch):
        self.forward_calls += 1
        loc = forward_batch.out_cache_loc
        base = input_ids.to(torch.float32)[:, None, None] * 0.5 + positions.to(torch.float32)[:, None, None]
        if self.layout == "mla":
            latent = base + torch.arange(KV_LORA_RANK + ROPE_DIM, dtype=torch.float32, device=loc.device).reshape(
                1, 1, -1) * 0.01
            for layer in self.layers:
                self.pool.set_kv_buffer(layer, loc, latent + layer.layer_id, None)
        else:
            k = base + torch.arange(HEADS * HEAD_DIM, dtype=torch.float32, device=loc.device).reshape(
                1, HEADS, HEAD_DIM) * 0.01
            if self.layout in ("swa", "mtp"):
                # The attention backend translates the write location once per forward.
                mapping = self._swa_mapping
                swa_loc = self.pool.translate_loc_from_full_to_swa(loc) if mapping is None else mapping[loc]
                loc = self._write_loc(loc=loc, swa_loc=swa_loc)
            for layer in self.layers:
                self.pool.set_kv_buffer(layer, loc, k + layer.layer_id, -k)
        next_ids = (input_ids * 7 + positions * 3 + 1) % VOCAB
        return torch.nn.functional.one_hot(next_ids.long(), VOCAB).to(torch.float32)


class RealRunner:
    """What ``apply`` wires into sglang's ModelRunner, around real pools: the install hook right after the
    pools and allocator exist, the generated ``canary_ctx`` member, ``forward`` and ``sample``."""

    def __init__(self, sg, server_args, layout: str = "mha", *, device: str = "cpu", is_draft_worker: bool = False,
                 size: int = 256, size_swa: int = 96, max_reqs: int = 8, max_context: int = 96, window: int = 8,
                 target: Optional["RealRunner"] = None):
        """``target``: a draft runner sharing that runner's req-pool rows and KV allocator, as sglang's EAGLE draft
        runners do; layout "mtp": a multi-layer EAGLE draft's pool, an SWA pool whose full half has no layers."""
        mp = sg.memory_pool
        self.server_args = server_args
        self.device = device
        self.is_draft_worker = is_draft_worker
        self.req_to_token_pool = target.req_to_token_pool if target is not None else mp.ReqToTokenPool(
            size=max_reqs, max_context_len=max_context, device=device, enable_memory_saver=False
        )
        if layout == "mha":
            self.token_to_kv_pool = mp.MHATokenToKVPool(
                size=size, page_size=1, dtype=DTYPE, head_num=HEADS, head_dim=HEAD_DIM, layer_num=LAYERS,
                device=device, enable_memory_saver=False,
            )
        elif layout == "mla":
            self.token_to_kv_pool = mp.MLATokenToKVPool(
                size=size, page_size=1, dtype=DTYPE, kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=ROPE_DIM,
                layer_num=LAYERS, device=device, enable_memory_saver=False,
            )
        elif layout in ("swa", "mtp"):
            self.token_to_kv_pool = sg.swa_memory_pool.SWAKVPool(
                size=size, size_swa=size_swa, page_size=1, dtype=DTYPE, head_num=HEADS, head_dim=HEAD_DIM,
                swa_attention_layer_ids=[1] if layout == "swa" else [0],
                full_attention_layer_ids=[0] if layout == "swa" else [], device=device, enable_memory_saver=False,
            )
        else:
            raise ValueError(f"unknown layout {layout!r}")
        if target is not None:
            self.token_to_kv_pool_allocator = target.token_to_kv_pool_allocator
        elif layout == "swa":
            self.token_to_kv_pool_allocator = sg.swa_allocator.SWATokenToKVPoolAllocator(
                size=size, size_swa=size_swa, page_size=1, dtype=DTYPE, device=device,
                kvcache=self.token_to_kv_pool, need_sort=False,
            )
        else:
            self.token_to_kv_pool_allocator = sg.token_allocator.TokenToKVPoolAllocator(
                size, DTYPE, device, self.token_to_kv_pool, False
            )
        self.sliding_window_size = window if layout in ("swa", "mtp") else None
        allocator = self.token_to_kv_pool_allocator
        mapping = None if target is None else getattr(allocator, "full_to_swa_index_mapping", None)
        self.model = TinyModel(sg, self.token_to_kv_pool, layout, self.sliding_window_size, mapping).to(device)
        self.model_config = SimpleNamespace(vocab_size=VOCAB)  # sglang's ModelConfig field the token oracle reads
        self.canary_manager = install_canary(server_args=server_args, model_runner=self)

    # The member `apply` generates for ModelRunner.
    def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
        manager = None if self.is_draft_worker else self.canary_manager
        return canary_context(manager, forward_batch, outside=outside, active=active)

    def forward(self, forward_batch):
        with self.canary_ctx(forward_batch, outside=[0], active=0):
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits_output, forward_batch):
        """Next-token ids, one per request (greedy over the last position of each request)."""
        if forward_batch.forward_mode.is_extend():
            last = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
            logits_output = logits_output[last.long()]
        return logits_output.argmax(dim=-1)


@dataclass
class Req:
    row: int
    tokens: list  # every token id of the request so far, target order
    slots: list = field(default_factory=list)  # full-pool slot of each cached position
    swa_evicted: int = 0  # leading positions whose SWA slot was released


class Scheduler:
    """Rows from the real ReqToTokenPool, slots from the real allocator, real ForwardBatch objects."""

    def __init__(self, sg, runner: RealRunner):
        self.sg = sg
        self.runner = runner
        self.device = runner.device
        self.allocator = runner.token_to_kv_pool_allocator
        self.swa = runner.sliding_window_size is not None

    def new_request(self, tokens) -> Req:
        (row,) = self.runner.req_to_token_pool.alloc_rows(1)
        return Req(row=row, tokens=list(tokens))

    def alloc(self, n: int) -> list:
        slots = self.allocator.alloc(n)
        if slots is None:
            raise RuntimeError(f"the allocator has no {n} free slots")
        return slots.tolist()

    def _evict(self, reqs) -> None:
        """Release SWA slots the coming forward no longer reads (positions before cached - window)."""
        if not self.swa:
            return
        window = self.runner.sliding_window_size
        for r in reqs:
            keep_from = max(0, len(r.slots) - window)
            if keep_from > r.swa_evicted:
                self.allocator.free_swa(self.tensor(r.slots[r.swa_evicted:keep_from]))
                r.swa_evicted = keep_from

    def _map(self, reqs) -> None:
        pool = self.runner.req_to_token_pool
        for r in reqs:
            pool.write((r.row, slice(0, len(r.slots))), self.tensor(r.slots, torch.int32))

    def extend(self, reqs, *, chunk: Optional[int] = None):
        """An extend (prefill) batch; with ``chunk``, at most that many new tokens per request (chunked prefill)."""
        self._evict(reqs)
        prefix = [len(r.slots) for r in reqs]
        new = [len(r.tokens) - p if chunk is None else min(chunk, len(r.tokens) - p) for r, p in zip(reqs, prefix)]
        ids, locs = [], []
        for r, p, n in zip(reqs, prefix, new):
            slots = self.alloc(n)
            r.slots += slots
            ids += r.tokens[p:p + n]
            locs += slots
        self._map(reqs)
        fm = self.sg.forward_batch_info
        prefix_t = self.tensor(prefix, torch.int32)
        new_t = self.tensor(new, torch.int32)
        positions, start_loc = fm.compute_position_torch(prefix_t, new_t)
        return self._batch(
            reqs, fm.ForwardMode.EXTEND, ids, locs, positions=positions,
            extend_prefix_lens=prefix_t, extend_seq_lens=new_t, extend_start_loc=start_loc,
            extend_num_tokens=sum(new), extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=new,
        )

    def decode(self, reqs, next_tokens):
        for r, t in zip(reqs, next_tokens):
            r.tokens.append(int(t))
        self._evict(reqs)
        locs = []
        for r in reqs:
            (slot,) = self.alloc(1)
            r.slots.append(slot)
            locs.append(slot)
        self._map(reqs)
        ids = [r.tokens[-1] for r in reqs]
        positions = self.tensor([len(r.slots) - 1 for r in reqs])
        return self._batch(reqs, self.sg.forward_batch_info.ForwardMode.DECODE, ids, locs, positions=positions)

    def _batch(self, reqs, mode, ids, locs, **fields):
        seq_lens = [len(r.slots) for r in reqs]
        return self.sg.forward_batch_info.ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=self.tensor(ids),
            req_pool_indices=self.tensor([r.row for r in reqs]),
            seq_lens=self.tensor(seq_lens),
            out_cache_loc=self.tensor(locs),
            seq_lens_sum=sum(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
            **fields,
        )

    def step(self, batch):
        """One forward through the wired ModelRunner and the sampler: the next token of each request."""
        logits = self.runner.forward(batch)
        return self.runner.sample(logits, batch).tolist()

    def tensor(self, values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def finish(self, req: Req) -> None:
        slots = self.tensor(req.slots)
        if self.swa:
            self.allocator.free_swa(slots[req.swa_evicted:])
            self.allocator.free_full(slots)
        else:
            self.allocator.free(slots)
        self.runner.req_to_token_pool.free_rows([req.row])

    def draft_round(self, reqs, steps: int, guesses):
        """One multi-step EAGLE draft on a draft runner, through the sites `apply` wires in the EAGLE worker:
        the outside batch (decode mode) plans every step, each step's forward runs in its own active
        sub-forward. The speculative slots are released after (drafts rejected)."""
        first = [len(r.slots) for r in reqs]
        step_slots = [self.alloc(steps) for _ in reqs]
        for r, s in zip(reqs, step_slots):
            r.slots += s
        self._map(reqs)
        decode = self.sg.forward_batch_info.ForwardMode.DECODE
        outer = self._batch(reqs, decode, [g[0] for g in guesses], [s[0] for s in step_slots],
                            positions=self.tensor(first))
        outer.seq_lens = self.tensor([f + 1 for f in first])
        manager = self.runner.canary_manager
        with canary_context(manager, outer, outside=list(range(steps))):
            for i in range(steps):
                batch = dataclasses.replace(
                    outer,
                    input_ids=self.tensor([g[i] for g in guesses]),
                    positions=self.tensor([f + i for f in first]),
                    out_cache_loc=self.tensor([s[i] for s in step_slots]),
                )
                with canary_context(manager, active=i):
                    self.runner.model.forward(batch.input_ids, batch.positions, batch)
        for r in reqs:
            self.allocator.free(self.tensor(r.slots[-steps:]))
            r.slots = r.slots[:-steps]
