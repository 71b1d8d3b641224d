"""A small sglang-shaped engine for the runtime tests: real pools, real batches, a model that writes KV.

Its ``MiniRunner`` carries the same member the ``apply`` wiring generates (``canary_ctx``)
and calls ``install_canary`` right after its pools exist, as the install hook does, and has
sglang's ``sample(logits_output, forward_batch)``. Requests are driven by hand (extend, decode,
multi-step EAGLE-style draft) so tests control every step. As in sglang, req-pool row 0 is
never handed out: CUDA-graph padding rows point at it.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import torch

from canary_instrument.runtime import canary_context, install_canary

HEADS, HEAD_DIM, LAYERS, LATENT = 2, 4, 2, 8


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND = 4
    IDLE = 5

    # sglang counts target-verify and draft-extend as extend modes too.
    def is_extend(self):
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def is_decode(self):
        return self == ForwardMode.DECODE

    def is_target_verify(self):
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self):
        return self == ForwardMode.DRAFT_EXTEND

    def is_idle(self):
        return self == ForwardMode.IDLE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    spec_info: Optional[object] = None
    num_tokens_per_req: Optional[int] = None


class ReqToTokenPool:
    """``size`` usable rows plus row 0, the padding row (sglang's layout)."""

    def __init__(self, size: int, max_context_len: int, device):
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32, device=device)
        self.free = list(range(1, size + 1))


class MHATokenToKVPool:
    def __init__(self, size: int, device, layers: int = LAYERS):
        shape = (size + 1, HEADS, HEAD_DIM)
        self.k_buffer = [torch.zeros(shape, device=device) for _ in range(layers)]
        self.v_buffer = [torch.zeros(shape, device=device) for _ in range(layers)]

    def set_kv(self, loc, k, v):
        for layer in range(len(self.k_buffer)):
            self.k_buffer[layer][loc] = k + layer
            self.v_buffer[layer][loc] = v + layer


class MLATokenToKVPool:
    def __init__(self, size: int, device):
        self.kv_buffer = [torch.zeros((size + 1, 1, LATENT), device=device) for _ in range(LAYERS)]

    def set_kv(self, loc, k, v):
        for layer in range(len(self.kv_buffer)):
            self.kv_buffer[layer][loc] = k.reshape(-1, 1, LATENT) + layer


class SWAKVPool:
    def __init__(self, size: int, size_swa: int, device):
        self.full_kv_pool = MHATokenToKVPool(size, device, layers=1)
        self.swa_kv_pool = MHATokenToKVPool(size_swa, device, layers=1)
        self.full_to_swa_index_mapping = torch.zeros(size + 1, dtype=torch.int64, device=device)

    def set_kv(self, loc, k, v):
        self.full_kv_pool.set_kv(loc, k, v)
        swa_loc = self.full_to_swa_index_mapping[loc]
        self.swa_kv_pool.set_kv(swa_loc, k, v)


class TinyModel(torch.nn.Module):
    """Writes a KV row derived from (token, position) for every new token, like attention would."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.forward_calls = 0
        self.scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)

    def forward(self, input_ids, positions, forward_batch):
        self.forward_calls += 1
        base = input_ids.to(torch.float32)[:, None, None] * 0.5 + positions.to(torch.float32)[:, None, None]
        k = base + torch.arange(HEADS * HEAD_DIM, device=input_ids.device).reshape(1, HEADS, HEAD_DIM) * self.scale
        self.pool.set_kv(forward_batch.out_cache_loc, k, -k)
        return k.sum(dim=(1, 2))


class LogitsProcessor(torch.nn.Module):
    """Named as sglang's logits module: one logit row per token from the model's last hidden state."""

    def __init__(self, vocab: int = 64):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1, 1, vocab), requires_grad=False)

    def forward(self, hidden):
        return hidden[:, None] * self.weight[None, :]


class LogitsModel(TinyModel):
    """Computes its logits after every KV write, as sglang's generating models do (their ``LogitsProcessor``).
    ``spin_cycles``: the GPU spins that long before the KV write (a slow forward), on CUDA."""

    spin_cycles = 0

    def __init__(self, pool):
        super().__init__(pool)
        self.logits_processor = LogitsProcessor()
        self.streams = []  # the stream each forward ran on

    def forward(self, input_ids, positions, forward_batch):
        if input_ids.is_cuda:
            self.streams.append(torch.cuda.current_stream())
            if self.spin_cycles:
                torch.cuda._sleep(self.spin_cycles)
        return self.logits_processor(super().forward(input_ids, positions, forward_batch))


class NestedModel(TinyModel):
    """Re-enters its own forward for the language part, as vision-language models do."""

    def forward(self, input_ids, positions, forward_batch, _inner=False):
        if _inner:
            return super().forward(input_ids, positions, forward_batch)
        return self(input_ids, positions, forward_batch, _inner=True)


def server_args(**kw):
    base = dict(kv_canary="log", kv_canary_real_kv="partial", speculative_num_steps=None, kv_canary_stats_interval=None)
    base.update(kw)
    return SimpleNamespace(**base)


class MiniRunner:
    """A ModelRunner-shaped object: pools, model, ``canary_ctx`` member, install hook."""

    def __init__(self, args, *, layout="mha", device="cpu", size=256, size_swa=128, max_reqs=8,
                 max_context=64, window=4, is_draft_worker=False, model_cls=TinyModel, req_to_token_pool=None):
        self.server_args = args
        self.device = device
        self.is_draft_worker = is_draft_worker
        self.req_to_token_pool = req_to_token_pool or ReqToTokenPool(max_reqs, max_context, device)
        if layout == "mha":
            self.token_to_kv_pool = MHATokenToKVPool(size, device)
        elif layout == "mla":
            self.token_to_kv_pool = MLATokenToKVPool(size, device)
        else:
            self.token_to_kv_pool = SWAKVPool(size, size_swa, device)
        self.sliding_window_size = window if layout == "swa" else None
        self.model = model_cls(self.token_to_kv_pool).to(device)
        self.canary_manager = install_canary(server_args=args, model_runner=self)

    # The member `apply` generates for ModelRunner.
    def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
        manager = None if self.is_draft_worker else self.canary_manager
        return canary_context(manager, forward_batch, outside=outside, active=active)

    def forward(self, forward_batch):
        with self.canary_ctx(forward_batch, outside=[0], active=0):
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits_output, forward_batch):
        """sglang's ``ModelRunner.sample``: one next token per request. The tiny model has no logits, so
        the tests choose the tokens (``forward_and_sample``) and this returns them as a sampler would."""
        return logits_output

    def forward_and_sample(self, forward_batch, next_tokens):
        """A serving step: the forward, then the sampler producing ``next_tokens`` (one per request)."""
        self.forward(forward_batch)
        return self.sample(torch.tensor(next_tokens, dtype=torch.int32, device=self.device), forward_batch)


@dataclass
class Req:
    row: int
    tokens: list  # target-order token ids, all of them cached after the forward that added them
    slots: list = field(default_factory=list)  # full slot of each cached position


class Scheduler:
    """Allocates rows and slots, builds batches, evicts out-of-window SWA slots."""

    def __init__(self, runner: MiniRunner):
        self.runner = runner
        self.device = runner.device
        pool = runner.token_to_kv_pool
        size = (pool.full_kv_pool.k_buffer[0] if hasattr(pool, "full_kv_pool") else
                (pool.kv_buffer[0] if hasattr(pool, "kv_buffer") else pool.k_buffer[0])).shape[0] - 1
        self.free_slots = list(range(1, size + 1))
        self.swa = hasattr(pool, "full_kv_pool")
        if self.swa:
            # Handed out from the top so SWA indices differ from full indices (a real remapping).
            self.free_swa = list(range(pool.swa_kv_pool.k_buffer[0].shape[0] - 1, 0, -1))

    def _alloc(self, n):
        slots, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        if self.swa:
            mapping = self.runner.token_to_kv_pool.full_to_swa_index_mapping
            for s in slots:
                mapping[s] = self.free_swa.pop(0)
        return slots

    def _evict(self, req: Req):
        """Free SWA slots the coming forward no longer reads: positions before cached - window."""
        if not self.swa:
            return
        window = self.runner.sliding_window_size
        mapping = self.runner.token_to_kv_pool.full_to_swa_index_mapping
        for s in req.slots[: max(0, len(req.slots) - window)]:
            if int(mapping[s]) != 0:
                self.free_swa.append(int(mapping[s]))
                mapping[s] = 0

    def new_request(self, tokens, share_from: Optional[Req] = None, shared: int = 0) -> Req:
        row = self.runner.req_to_token_pool.free.pop(0)
        req = Req(row=row, tokens=list(tokens))
        if share_from is not None:
            req.slots = list(share_from.slots[:shared])
        return req

    def extend(self, reqs, mode=ForwardMode.EXTEND):
        for r in reqs:
            self._evict(r)
        prefix = [len(r.slots) for r in reqs]
        new = [len(r.tokens) - p for r, p in zip(reqs, prefix)]
        ids, pos, locs = [], [], []
        for r, p, n in zip(reqs, prefix, new):
            slots = self._alloc(n)
            r.slots += slots
            ids += r.tokens[p:]
            pos += list(range(p, p + n))
            locs += slots
        batch = self._batch(reqs, mode, ids, pos, locs, prefix=prefix, extend=new)
        self._map(reqs)
        return batch

    def decode(self, reqs, next_tokens):
        for r, t in zip(reqs, next_tokens):
            r.tokens.append(t)
        for r in reqs:
            self._evict(r)
        ids = [r.tokens[-1] for r in reqs]
        pos = [len(r.slots) for r in reqs]
        locs = []
        for r in reqs:
            (slot,) = self._alloc(1)
            r.slots.append(slot)
            locs.append(slot)
        self._map(reqs)
        return self._batch(reqs, ForwardMode.DECODE, ids, pos, locs)

    def _map(self, reqs):
        table = self.runner.req_to_token_pool.req_to_token
        for r in reqs:
            table[r.row, : len(r.slots)] = torch.tensor(r.slots, dtype=torch.int32)

    def _batch(self, reqs, mode, ids, pos, locs, prefix=None, extend=None):
        dev = self.device

        def t(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype, device=dev)

        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            req_pool_indices=t([r.row for r in reqs]),
            seq_lens=t([len(r.slots) for r in reqs]),
            input_ids=t(ids),
            positions=t(pos),
            out_cache_loc=t(locs),
            extend_prefix_lens=t(prefix, torch.int32) if prefix is not None else None,
            extend_seq_lens=t(extend, torch.int32) if extend is not None else None,
        )

    def finish(self, req: Req):
        self.free_slots += req.slots
        if self.swa:
            mapping = self.runner.token_to_kv_pool.full_to_swa_index_mapping
            for s in req.slots:
                if int(mapping[s]) != 0:
                    self.free_swa.append(int(mapping[s]))
                    mapping[s] = 0
        self.runner.req_to_token_pool.free.append(req.row)


class RecordingOps:
    """The real backend, plus a record of each call: kernel, sub-forward, the plan it saw, model calls so far, and
    (``streams``) the stream it was enqueued on."""

    def __init__(self, manager, model):
        self.inner = manager.ops
        self.manager = manager
        self.model = model
        self.calls = []
        self.plans = []  # the PlanInputs of each call
        self.streams = []  # the stream each call was enqueued on (CUDA)
        manager.ops = self

    def _record(self, kernel, plan):
        self.plans.append(plan)
        self.streams.append(torch.cuda.current_stream() if plan.enabled.is_cuda else None)
        self.calls.append(
            dict(
                kernel=kernel,
                index=self.manager.steps.active.index,
                enabled=int(plan.enabled[0]),
                **plan_rows(plan),
                model_calls=self.model.forward_calls,
            )
        )

    def pre_forward(self, state, plan, input_ids):
        self._record("pre", plan)
        self.inner.pre_forward(state, plan, input_ids)

    def post_forward(self, state, plan):
        self._record("post", plan)
        self.inner.post_forward(state, plan)


def plan_rows(plan) -> dict:
    """What a plan asks for, per batch row, as the kernels read it (``state.PlanInputs``)."""
    n = plan.num_reqs
    rows = plan.req_pool_indices[:n].tolist()
    extend = [plan.extend_const] * n if plan.extend_const > 0 else plan.extend_lens[:n].tolist()
    prefix = plan.prefix_lens[:n].tolist()
    if plan.prefix_is_end:
        prefix = [p - e for p, e in zip(prefix, extend)]
    return dict(num_reqs=n, req_pool_indices=rows, prefix=prefix, extend=extend)


def draft_step_batches(sched: Scheduler, reqs, steps: int, guesses):
    """A multi-step draft: the outside batch (decode mode) and one batch per step (its own tokens and slots)."""
    import dataclasses

    first = [len(r.slots) for r in reqs]
    slots = [sched._alloc(steps) for _ in reqs]
    for r, s in zip(reqs, slots):
        r.slots += s
    sched._map(reqs)
    dev = sched.device
    outer = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(reqs),
        req_pool_indices=torch.tensor([r.row for r in reqs], device=dev),
        seq_lens=torch.tensor(first, device=dev),  # an EAGLE draft's seq_lens stay pre-bump (sglang)
        input_ids=torch.tensor([g[0] for g in guesses], device=dev),
        positions=torch.tensor(first, device=dev),
        out_cache_loc=torch.tensor([s[0] for s in slots], device=dev),
    )
    per_step = [
        dataclasses.replace(
            outer,
            input_ids=torch.tensor([g[i] for g in guesses], device=dev),
            positions=torch.tensor([f + i for f in first], device=dev),
            out_cache_loc=torch.tensor([s[i] for s in slots], device=dev),
        )
        for i in range(steps)
    ]
    return outer, per_step


class GraphRunner:
    """Decode graphs per batch size over static buffers, like sglang's CudaGraphRunner (CUDA only).

    Captured before ``mark_init_finished`` through the capture site's wiring (the active
    sub-forward only); ``replay`` pads the batch with req-pool row 0, position 0 and slot 0."""

    def __init__(self, runner, sizes=(1, 2, 4), steps=1):
        self.runner, self.sizes, self.steps = runner, sorted(sizes), steps
        dev, n = runner.device, max(sizes)
        self.buffers = {name: torch.zeros((steps, n), dtype=torch.int64, device=dev)
                        for name in ("input_ids", "positions", "out_cache_loc")}
        self.req_pool_indices = torch.zeros(n, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.graphs = {}
        manager = runner.canary_manager
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):
            batches = [self._static(bs, i) for i in range(steps)]

            def run_once():
                for i, b in enumerate(batches):
                    # The capture site: only the active sub-forward, no plan (init has not finished).
                    with manager.with_active_single_forward_manager(i):
                        runner.model.forward(b.input_ids, b.positions, b)

            for _ in range(2):
                torch.cuda.synchronize()
                run_once()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                run_once()
            self.graphs[bs] = graph

    def _static(self, bs, i):
        return ForwardBatch(ForwardMode.DECODE, bs, self.req_pool_indices[:bs], self.seq_lens[:bs],
                            self.buffers["input_ids"][i, :bs], self.buffers["positions"][i, :bs],
                            self.buffers["out_cache_loc"][i, :bs])

    def replay(self, per_step):
        raw = per_step[0].batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, raw)]
        for buf in self.buffers.values():
            buf.zero_()  # padding requests write slot 0, the padding slot
        self.req_pool_indices.zero_()
        self.seq_lens.fill_(1)
        self.req_pool_indices[:raw].copy_(per_step[0].req_pool_indices)
        self.seq_lens[:raw].copy_(per_step[0].seq_lens)
        for i, b in enumerate(per_step):
            for name in self.buffers:
                self.buffers[name][i, :raw].copy_(getattr(b, name))
        self.graphs[bs].replay()


class _LaunchRecorder:
    """The manager's ops while a ``ReplayedGraph`` captures: each canary launch is run and kept, as a CUDA graph
    keeps the kernels launched into it."""

    def __init__(self, inner):
        self.inner = inner
        self.launches = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def pre_forward(self, state, plan, input_ids):
        self.launches.append(("pre_forward", (state, plan, input_ids)))
        self.inner.pre_forward(state, plan, input_ids)

    def post_forward(self, state, plan):
        self.launches.append(("post_forward", (state, plan)))
        self.inner.post_forward(state, plan)


class ReplayedGraph:
    """A draft-extend graph on any device, the way a CUDA graph behaves for the canary: captured once over static
    buffers (the canary passes launched into it by the bracketed forward, which plan from those buffers), then
    replayed with no host call into the manager: the kept launches and the model run again over the refilled
    buffers. The capture runs inside the capture site ``apply`` wires (the active sub-forward only). One graph per
    batch size, padded with slot 0 and, by ``padding``:

    - ``"zero"``: req-pool row 0 (sglang's single-layer draft-extend graph, and the multi-layer one from 0.5.20);
    - ``"stale-marked"``: sglang 0.5.16-0.5.19's multi-layer draft-extend graph (``fill_draft_extend_prepare_buffers
      _kernel``): a padded row keeps the req-pool index of an earlier replay (a live request's), its ``seq_lens``
      is the attention backend's fill value (1) and its ``spec_info.num_accept_tokens`` is -1;
    - ``"stale"``: sglang 0.5.13-0.5.15's: the stale index and the fill value, the accept count stale too."""

    FILL_SEQ_LEN = 1  # get_cuda_graph_seq_len_fill_value() of FlashInfer, FA3, Triton...

    def __init__(self, runner, width: int, sizes=(1, 2), padding: str = "zero"):
        assert padding in ("zero", "stale-marked", "stale")
        self.runner, self.width, self.sizes, self.padding = runner, width, sorted(sizes), padding
        dev, n = runner.device, max(sizes)

        def buf(count, fill=0):
            return torch.full((count,), fill, dtype=torch.int64, device=dev)

        self.input_ids, self.positions, self.out_cache_loc = buf(n * width), buf(n * width), buf(n * width)
        self.req_pool_indices, self.seq_lens = buf(n), buf(n, width)
        self.extend_seq_lens = torch.full((n,), width, dtype=torch.int32, device=dev)
        self.num_accept_tokens = torch.ones((n,), dtype=torch.int32, device=dev)
        manager = runner.canary_manager
        self.launches = {}
        for bs in self.sizes:
            static = self.batch(bs)
            inner = manager.ops
            manager.ops = recorder = _LaunchRecorder(inner)
            try:
                with canary_context(manager, active=0):
                    runner.model.forward(static.input_ids, static.positions, static)
            finally:
                manager.ops = inner
            self.launches[bs] = recorder.launches

    def batch(self, bs: int) -> ForwardBatch:
        # sglang's v2 draft-extend graph batch: extend_seq_lens but no extend_prefix_lens (prefix = seq_lens - width).
        tokens = bs * self.width
        return ForwardBatch(ForwardMode.DRAFT_EXTEND, bs, self.req_pool_indices[:bs], self.seq_lens[:bs],
                            self.input_ids[:tokens], self.positions[:tokens], self.out_cache_loc[:tokens],
                            extend_seq_lens=self.extend_seq_lens[:bs], num_tokens_per_req=self.width,
                            spec_info=SimpleNamespace(num_accept_tokens=self.num_accept_tokens[:bs]))

    def replay(self, batch: ForwardBatch) -> None:
        raw = batch.batch_size
        bs = self.sizes[bisect.bisect_left(self.sizes, raw)]
        for buf in (self.input_ids, self.positions, self.out_cache_loc):
            buf.zero_()
        if self.padding == "zero":
            self.req_pool_indices.zero_()
            self.seq_lens.fill_(self.width)
        else:
            self.seq_lens.fill_(self.FILL_SEQ_LEN)
            if self.padding == "stale-marked":
                self.num_accept_tokens.fill_(-1)
        accepted = getattr(batch.spec_info, "num_accept_tokens", None)
        self.num_accept_tokens[:raw].copy_(accepted if accepted is not None else torch.ones(raw))
        tokens = raw * self.width
        self.input_ids[:tokens].copy_(batch.input_ids)
        self.positions[:tokens].copy_(batch.positions)
        self.out_cache_loc[:tokens].copy_(batch.out_cache_loc)
        self.req_pool_indices[:raw].copy_(batch.req_pool_indices)
        self.seq_lens[:raw].copy_(batch.seq_lens)
        static = self.batch(bs)
        ops = self.runner.canary_manager.ops
        model = self.runner.model
        for kernel, args in self.launches[bs]:
            if kernel == "post_forward":
                type(model).forward(model, static.input_ids, static.positions, static)  # the model, unbracketed
            getattr(ops, kernel)(*args)
        if not self.launches[bs]:
            type(model).forward(model, static.input_ids, static.positions, static)
