"""GPU benchmarks of the canary kernels against the bars of DESIGN.md section 7.

Everything is timed with triton.testing.do_bench on CUDA-graph replays, against a device-to-device
copy measured in the same run. Per-pass figures (verify, tuning, scaling) are per pass inside a graph
of 20 passes, each after an L2 flush (``per_pass_ms``): the runtime's passes are nodes of the model's
graph, so they pay no graph launch of their own, and the model's work has flushed their data from L2.

    PYTHONPATH=$PWD python bench/kernels/bench_kernels.py --out DIR

writes DIR/results.json and DIR/scaling.png (a plot of its scaling table); a run kept goes into results/,
and write_results.py writes RESULTS.md from the runs there.

Bytes-per-slot model for verify (one verified position, per pass): req_to_token entry 4 B once
per position (the target's verify reads no per-position expected token: the sampled-token check
reads one 4 B entry per request), plus per (group, half) the 32 B canary row and,
with realkv=partial, the 32 B DRAM sector holding the 16 B of layer 0's KV row the fingerprint
covers (rows are 2 KiB apart, so no two positions share a sector), and on layers - 1 of layers
passes the 32 B sector of the layer's fingerprint-table entry (8 B; not counted). The layers are
--layers buffers (Llama-3-8B: 32), backed by --layer-buffers distinct ones. The predecessor row
and predecessor req_to_token entry are the neighbouring lane's and are not counted (cache hits
for contiguous pages; for scattered slots they are real extra traffic, which is the point of
reporting scattered beside contiguous).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from canary_instrument.runtime.passes import hashing, reference
from canary_instrument.runtime.passes.layers import attach_layers
from canary_instrument.runtime.passes.state import (
    GROUP_FULL,
    GROUP_SWA,
    HALF_K,
    HALF_V,
    IDENTITY_FIELDS,
    IDENTITY_LAST_NEW,
    CanaryGroup,
    CanaryState,
    PlanInputs,
)
from canary_instrument.runtime.features.radix_walk import RadixCursor
from canary_instrument.runtime.features.sweep import Sweeper
from canary_instrument.runtime.features.sweep_triton import TritonSweepOps
from canary_instrument.runtime.passes.triton_ops import TritonCanaryOps

KV_BYTES_PER_TOKEN = 128 * 1024  # Llama-3-8B: 32 layers x 8 KV heads x 128 dim x 2 (K, V) x 2 bytes
LAYER0_ROW_WORDS = 8 * 128 * 2 // 8  # one layer's K (or V) row: 8 heads x 128 dim x bf16 = 2 KiB
# Layers a fingerprinted half carries (Llama-3-8B: 32) and how many distinct buffers back them: a million-slot
# layer is 2 GiB per half, so layers beyond LAYER_BUFFERS reuse those buffers round-robin (set by main()).
LAYERS = 32
LAYER_BUFFERS = 4
SCALING = [(8, 16384), (16, 16384), (32, 8192), (64, 4096), (128, 4096), (256, 2048), (512, 2048), (1024, 1024)]
DEV = "cuda"


def log(*args):
    print(*args, flush=True)


# ---------------------------------------------------------------- pools


REQUEST_SIDE = False  # --request-side: the target's identity and write-slot checks in every plan


def build(layout: str, realkv: str, reqs: int, ctx: int, *, scattered=False, window=1024, expected=True,
          v_half=True, max_bs=None, seed=0, pool_rows=0):
    """A pool whose rows for positions [0, ctx - 1) of every request are written and fingerprinted.
    ``pool_rows``: req-pool capacity (rows of req_to_token), at least reqs + 1; the unused rows are zero."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    slots = reqs * ctx + 1
    order = torch.arange(1, slots, device=DEV, dtype=torch.int64)
    if scattered:
        order = order[torch.randperm(slots - 1, device=DEV, generator=g)]
    # Req-pool row 0 is the padding row (graph padding points at it); requests use rows 1..reqs.
    r2t = torch.zeros((max(reqs + 1, pool_rows), ctx), dtype=torch.int32, device=DEV)
    r2t[1 : reqs + 1] = order.view(reqs, ctx).to(torch.int32)
    halves = [HALF_K, HALF_V] if v_half and layout != "mla" else [HALF_K]
    kinds = [GROUP_FULL, GROUP_SWA] if layout == "swa" else [GROUP_FULL]
    groups = []
    for kind in kinds:
        for half in halves:
            rows = torch.zeros((slots, 4), dtype=torch.int64, device=DEV)
            group = CanaryGroup(kind, half, rows)
            if realkv != "none":
                buffers = [torch.randint(-(2**62), 2**62, (slots, LAYER0_ROW_WORDS), dtype=torch.int64, device=DEV,
                                         generator=g) for _ in range(min(LAYERS, LAYER_BUFFERS))]
                attach_layers(group, [buffers[i % len(buffers)] for i in range(LAYERS)])
            groups.append(group)
    tokens = torch.randint(0, 128_000, (reqs, ctx + 1), device=DEV, generator=g)
    max_bs = max_bs or reqs
    state = CanaryState(
        layout=layout, realkv=realkv, groups=groups, req_to_token=r2t,
        token_offset=0,
        swa_mapping=torch.arange(slots, device=DEV) if layout == "swa" else None,
        swa_window=window if layout == "swa" else 0,
        ring=torch.zeros((1024, 8), dtype=torch.int64, device=DEV),
        ring_count=torch.zeros(1, dtype=torch.int64, device=DEV),
        counters=torch.zeros(4, dtype=torch.int64, device=DEV),
        group_verified=torch.zeros(2, dtype=torch.int64, device=DEV),
    )
    plan = PlanInputs(
        num_reqs=reqs,
        req_pool_indices=1 + torch.arange(max_bs, device=DEV, dtype=torch.int64) % reqs,
        prefix_lens=torch.zeros(max_bs, dtype=torch.int32, device=DEV),
        extend_lens=torch.full((max_bs,), ctx - 1, dtype=torch.int32, device=DEV),
        enabled=torch.tensor([1], dtype=torch.int32, device=DEV),
    )
    if REQUEST_SIDE:
        # A target's request-side checks: identity entries (recorded by the prefill below) and out_cache_loc.
        state.identity = torch.full((r2t.shape[0], IDENTITY_FIELDS), -1, dtype=torch.int64, device=DEV)
        plan.identity = IDENTITY_LAST_NEW
    ops = TritonCanaryOps()
    ops.pre_forward(state, plan, tokens[:, : ctx - 1].reshape(-1).contiguous())
    ops.post_forward(state, plan)
    if layout == "swa":  # evict everything before the window of the decode step
        lo = max(0, ctx - 1 - window)
        state.swa_mapping[r2t[:, :lo].reshape(-1).long()] = 0
    # Decode step: verify [0, ctx - 1), write position ctx - 1.
    plan.prefix_lens.fill_(ctx - 1)
    plan.extend_lens.fill_(1)
    decode_ids = tokens[:, ctx - 1].contiguous()
    if REQUEST_SIDE:
        plan.out_cache_loc = r2t[plan.req_pool_indices, ctx - 1].to(torch.int64)
    if expected:
        # The sampled-token check of a decode: each request's sampled token for position ctx - 1.
        state.sampled_tokens = torch.full((reqs + 1,), -1, dtype=torch.int32, device=DEV)
        state.sampled_tokens[1:] = decode_ids.to(torch.int32)
        plan.check_sampled = True
    reset(state)
    return state, plan, decode_ids


def decode_forward(ops, state, plan, ids):
    """One forward's canary work, as the bracket launches it: the pre-forward pass, then the post-forward."""

    def forward():
        ops.pre_forward(state, plan, ids)
        ops.post_forward(state, plan)

    return forward


def reset(state):
    state.ring_count.zero_()
    state.counters.zero_()
    state.group_verified.zero_()


def graph_of(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def bench_graph(fn) -> float:
    """Milliseconds per replay of a CUDA graph holding ``fn``'s launches (the graph's own launch included)."""
    graph = graph_of(fn)
    return do_bench(graph.replay, warmup=50, rep=300, return_mode="median")


FLUSH_BYTES = 128 << 20  # over twice the H100's 50 MB L2
PASSES = 20


def per_pass_ms(fn, passes=PASSES) -> float:
    """Milliseconds per call of ``fn`` as the runtime runs the passes: nodes inside the model's CUDA graph
    (no launch of their own), with their data out of L2 (the model's weights and KV went through it in
    between). One graph holds ``passes`` x (L2 flush, fn), another ``passes`` x flush; the difference of
    their replay medians, per pass. A replay of a graph holding one pass (``bench_graph``) also pays the
    graph's launch, several microseconds that a pass inside the model's graph never pays."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=DEV)

    def flushed():
        for _ in range(passes):
            flush.zero_()
            fn()

    def flush_only():
        for _ in range(passes):
            flush.zero_()

    return (bench_graph(flushed) - bench_graph(flush_only)) / passes


def copy_per_pass_tb_s(nbytes: int) -> float:
    """A device-to-device copy moving ``nbytes`` (read + written), timed like a pass (``per_pass_ms``)."""
    src = torch.empty(nbytes // 16, dtype=torch.int64, device=DEV).random_()
    dst = torch.empty_like(src)
    ms = per_pass_ms(lambda: dst.copy_(src))
    return nbytes / (ms * 1e-3)


# ---------------------------------------------------------------- serial baseline (upstream style)


@triton.jit
def _serial_mix64(z):
    z = z ^ (z >> 30)
    z = z * 0xBF58476D1CE4E5B9
    z = z ^ (z >> 27)
    z = z * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def serial_chain_write(input_ids_ptr, r2t_ptr, r2t_stride, req_pool_ptr, prefix_ptr, extend_ptr, rows_ptr):
    """One program per request walks its new tokens one by one: the upstream write."""
    r = tl.program_id(0)
    req_pool = tl.load(req_pool_ptr + r)
    prefix = tl.load(prefix_ptr + r).to(tl.int64)
    extend = tl.load(extend_ptr + r).to(tl.int64)
    state = tl.full([], 0x243F6A8885A308D3, tl.uint64)
    p = prefix
    while p < prefix + extend:
        token = tl.load(input_ids_ptr + p - prefix).to(tl.int64)
        slot = tl.load(r2t_ptr + req_pool * r2t_stride + p).to(tl.int64)
        tl.store(rows_ptr + slot * 4 + 0, token)
        tl.store(rows_ptr + slot * 4 + 1, p)
        tl.store(rows_ptr + slot * 4 + 2, state.to(tl.int64, bitcast=True))
        tl.store(rows_ptr + slot * 4 + 3, tl.zeros([], tl.int64))
        key = ((token & 0xFFFFFFFF) | (p << 32)).to(tl.uint64, bitcast=True)
        a = _serial_mix64(key ^ 0x9E3779B97F4A7C15) | 1
        b = _serial_mix64(key ^ 0xD1B54A32D192ED03)
        state = a * state + b
        p += 1


# ---------------------------------------------------------------- benchmarks


def copy_bandwidth() -> float:
    n = 1 << 28  # 2 GiB of int64 read + 2 GiB written
    src = torch.empty(n, dtype=torch.int64, device=DEV).random_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    return 2 * n * 8 / (ms * 1e-3)


CONFIGS = [(128, 4, 16), (128, 4, 8), (128, 2, 32), (256, 4, 16), (256, 8, 8)]  # (BLOCK, num_warps, programs/SM)
WRITE_TOKENS = 16384


KERNEL_DIR = None  # rendered kernels to time instead of the shipped ones (template variants; set by main())
LAYER_CHUNK = None  # layers the post pass fingerprints at once; None: the runtime's choice (set by main())


def make_ops(config):
    block, warps, per_sm = config
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    options = {k: v for k, v in dict(layer_chunk=LAYER_CHUNK, kernel_dir=KERNEL_DIR).items() if v is not None}
    return TritonCanaryOps(block=block, num_warps=warps, programs=sms * per_sm, **options)


def tune(results, copy_bw):
    """Sweep launch configurations per real-KV mode (none, partial), on the
    two ends of the scaling table: a 1M-position verify (contiguous) and the latency-bound 8 x 16384
    decode (pre + post). Per mode, returns the fastest verify (for the bandwidth table) and the one
    with the lowest worst-case share of attention time over both ends (for everything else)."""
    big_att = 64 * 16384 * KV_BYTES_PER_TOKEN / copy_bw
    small_att = 8 * 16384 * KV_BYTES_PER_TOKEN / copy_bw
    rows, verify_pick, forward_pick = [], {}, {}
    pick = lambda r: (r["block"], r["num_warps"], r["programs_per_sm"])  # noqa: E731
    for realkv in ("none", "partial"):
        state, plan, ids = build("mha", realkv, 64, 16385)
        plan.extend_lens.zero_()
        small_state, small_plan, small_ids = build("mha", realkv, 8, 16384)
        mode_rows = []
        for config in CONFIGS:
            ops = make_ops(config)
            ms = per_pass_ms(lambda: ops.pre_forward(state, plan, ids))
            small_ms = per_pass_ms(decode_forward(ops, small_state, small_plan, small_ids))
            row = dict(realkv=realkv, block=config[0], num_warps=config[1],
                       programs_per_sm=config[2], us=ms * 1e3, small_us=small_ms * 1e3,
                       score=max(ms * 1e-3 / big_att, small_ms * 1e-3 / small_att),
                       violations=int(state.ring_count[0]) + int(small_state.ring_count[0]))
            mode_rows.append(row)
            log("tune", row)
        rows += mode_rows
        verify_pick[realkv] = min(mode_rows, key=lambda r: r["us"])
        forward_pick[realkv] = min(mode_rows, key=lambda r: r["score"])
        del state, plan, small_state, small_plan
        torch.cuda.empty_cache()
    results["tuning"] = rows
    results["verify_config"] = verify_pick
    results["config"] = forward_pick
    return ({k: pick(v) for k, v in verify_pick.items()}, {k: pick(v) for k, v in forward_pick.items()})


def verify_bandwidth(copy_bw, results, config):
    out = []
    for realkv in ("none", "partial"):
        for scattered in (False, True):
            reqs, ctx = 64, 16385  # 64 x 16384 = 1,048,576 verified positions, K and V halves
            state, plan, ids = build("mha", realkv, reqs, ctx, scattered=scattered)
            plan.extend_lens.zero_()  # verify only
            ops = make_ops(config[realkv])
            verify = lambda: ops.pre_forward(state, plan, ids)  # noqa: E731
            ms = per_pass_ms(verify)
            replay_ms = bench_graph(verify)
            positions = reqs * (ctx - 1)
            per_pos = 4 + 2 * 32 + (2 * 32 if realkv == "partial" else 0)
            bw = positions * per_pos / (ms * 1e-3)
            same_size_copy = copy_per_pass_tb_s(positions * per_pos)
            bad = int(state.ring_count[0])
            row = dict(realkv=realkv, pages="scattered" if scattered else "contiguous", positions=positions,
                       entries=2 * positions, bytes_per_position=per_pos, us=ms * 1e3, replay_us=replay_ms * 1e3,
                       tb_s=bw / 1e12, fraction_of_copy=bw / copy_bw, same_size_copy_tb_s=same_size_copy / 1e12,
                       violations=bad)
            log("verify", row)
            out.append(row)
            del state, plan
            torch.cuda.empty_cache()
    results["verify"] = out


def write_vs_serial(results, config):
    """The 16k-token write (pre-forward, realkv=none) under the chosen launch configuration."""
    tokens = WRITE_TOKENS
    state, plan, _ = build("mla", "none", 1, 2, v_half=False)
    r2t = torch.zeros((2, tokens), device=DEV, dtype=torch.int32)
    r2t[1] = torch.arange(1, tokens + 1, device=DEV, dtype=torch.int32)
    rows = torch.zeros((tokens + 1, 4), dtype=torch.int64, device=DEV)
    state.groups[0].rows = rows
    state.req_to_token = r2t
    state.sampled_tokens = None
    plan.prefix_lens.zero_()
    plan.extend_lens.fill_(tokens)
    ids = torch.randint(0, 128_000, (tokens,), device=DEV)
    serial_rows = torch.zeros_like(rows)

    def serial():
        serial_chain_write[(1,)](ids, r2t, r2t.stride(0), plan.req_pool_indices, plan.prefix_lens,
                                 plan.extend_lens, serial_rows)

    serial_ms = bench_graph(serial)
    ops = make_ops(config)
    parallel_ms = bench_graph(lambda: ops.pre_forward(state, plan, ids))
    same = bool(torch.equal(serial_rows[1:], rows[1:]))
    row = dict(tokens=tokens, block=config[0], parallel_us=parallel_ms * 1e3, serial_us=serial_ms * 1e3,
               speedup=serial_ms / parallel_ms, rows_identical=same)
    log("write", row)
    results["write_16k"] = [row]


def vs_reference(results, config):
    out = []
    for layout in ("mha", "mla", "swa"):
        reqs, ctx = 64, 4096
        state, plan, ids = build(layout, "partial", reqs, ctx, window=1024)
        ops = make_ops(config["partial"])
        for name in ("pre_forward", "post_forward"):
            if name == "pre_forward":
                kernel = lambda: ops.pre_forward(state, plan, ids)  # noqa: E731
                torch_ref = lambda: reference.pre_forward(state, plan, ids)  # noqa: E731
            else:
                kernel = lambda: ops.post_forward(state, plan)  # noqa: E731
                torch_ref = lambda: reference.post_forward(state, plan)  # noqa: E731
            k_ms = bench_graph(kernel)
            r_ms = do_bench(torch_ref, warmup=3, rep=50, return_mode="median")
            row = dict(layout=layout, realkv="partial", kernel=name, batch=f"{reqs}x{ctx}", triton_us=k_ms * 1e3,
                       torch_us=r_ms * 1e3, speedup=r_ms / k_ms, violations=int(state.ring_count[0]))
            log("vs_reference", row)
            out.append(row)
        del state, plan
        torch.cuda.empty_cache()
    results["vs_reference"] = out


def scaling(copy_bw, results, realkv_modes, config, pool_rows):
    out = []
    for realkv in realkv_modes:
        for reqs, ctx in SCALING:
            state, plan, ids = build("mha", realkv, reqs, ctx, pool_rows=pool_rows)
            ops = make_ops(config[realkv]) if realkv != "all" else TritonCanaryOps()
            forward = decode_forward(ops, state, plan, ids)

            # realkv=all passes take milliseconds: a few per graph spread the launch just as well.
            ms = per_pass_ms(forward, passes=PASSES if realkv != "all" else 3)
            replay_ms = bench_graph(forward)
            attention_ms = reqs * ctx * KV_BYTES_PER_TOKEN / copy_bw * 1e3
            row = dict(realkv=realkv, reqs=reqs, ctx=ctx, pool_rows=state.req_to_token.shape[0],
                       canary_us=ms * 1e3, replay_us=replay_ms * 1e3, attention_us=attention_ms * 1e3,
                       percent=100 * ms / attention_ms, violations=int(state.ring_count[0]))
            log("scaling", row)
            out.append(row)
            del state, plan
            torch.cuda.empty_cache()
    results["scaling"] = out


SMALL = [(1, 1024), (1, 8192), (8, 1024), (8, 8192), (64, 1024)]
SMALL_PROGRAMS_PER_SM = (16, 4, 1)


def small_batches(results):
    """Where a small decode batch's canary time goes: each pass alone, per pass as the scaling table times
    them, realkv=partial, with what a server's pass also does (the freed-slot mark before the pre pass, the
    status publish into pinned host memory at the end of the post pass) and without, at several grid sizes."""
    from canary_instrument.runtime.checks.request_side import make_freed_buffer
    from canary_instrument.runtime.passes.status import allocate_status

    out = []
    for reqs, ctx in SMALL:
        for served in (True, False):
            state, plan, ids = build("mha", "partial", reqs, ctx, pool_rows=4097)
            if served:
                allocate_status(state, 1024, torch.device(DEV))
                state.freed = make_freed_buffer(state.req_to_token.shape[0], DEV)
            for per_sm in SMALL_PROGRAMS_PER_SM if served else SMALL_PROGRAMS_PER_SM[:1]:
                ops = make_ops((128, 4, per_sm))
                row = dict(reqs=reqs, ctx=ctx, served=served, programs_per_sm=per_sm,
                           pre_us=1e3 * per_pass_ms(lambda: ops.pre_forward(state, plan, ids)),
                           post_us=1e3 * per_pass_ms(lambda: ops.post_forward(state, plan)),
                           both_us=1e3 * per_pass_ms(decode_forward(ops, state, plan, ids)),
                           violations=int(state.ring_count.reshape(-1)[0]))
                log("small", row)
                out.append(row)
            del state, plan
            torch.cuda.empty_cache()
    results["small"] = out


BESIDE = [(1, 1024), (8, 1024), (8, 8192), (16, 1024), (16, 8192), (32, 1024), (64, 1024), (64, 4096), (256, 1024)]
BESIDE_PROGRAMS_PER_SM = (16, 1)  # the runtime's grid, and the narrowest
HIDDEN, QKV, FFN, VOCAB = 4096, 6144, 14336, 128256  # Llama-3-8B: one layer's projections, the LM head


class StandInForward:
    """A Llama-3-8B decode forward's memory traffic at a batch and context (32 layers of bf16 projections and a
    grouped-query attention read of each request's context, then the LM head's logits), for timing the canary
    passes beside a forward without a model: at small batches a decode streams its weights, which is what a pass
    beside it competes with. Distinct weights per layer; the KV of LAYER_BUFFERS layers, reused round-robin (L2
    holds neither)."""

    def __init__(self, reqs: int, ctx: int):
        def weight(rows, cols):
            return torch.empty((rows, cols), dtype=torch.bfloat16, device=DEV).normal_(std=0.02)

        self.layers = [(weight(HIDDEN, QKV), weight(HIDDEN, HIDDEN), weight(HIDDEN, 2 * FFN), weight(FFN, HIDDEN))
                       for _ in range(LAYERS)]
        self.kv = [torch.empty((2, reqs, 8, ctx, 128), dtype=torch.bfloat16, device=DEV).normal_()
                   for _ in range(LAYER_BUFFERS)]
        self.lm_head = weight(HIDDEN, VOCAB)
        self.x = torch.randn((reqs, HIDDEN), dtype=torch.bfloat16, device=DEV)
        self.reqs = reqs

    def body(self):
        """The layers: every KV read (and, in a model, written) here; the last hidden state."""
        x = self.x
        for i, (w_qkv, w_o, w_up, w_down) in enumerate(self.layers):
            q = (x @ w_qkv)[:, :HIDDEN].view(self.reqs, 32, 1, 128)
            k, v = self.kv[i % len(self.kv)]
            attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            x = x + attn.reshape(self.reqs, HIDDEN) @ w_o
            gate, up = (x @ w_up).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w_down
        return x

    def logits(self, x):
        return x @ self.lm_head

    def __call__(self):
        return self.logits(self.body())


def beside_forward(results, repeats=3):
    """What the canary adds to a decode step, against a stand-in forward in one CUDA graph: the passes in line
    (mark and pre pass before the forward, post pass after); the mark and pre pass on a second stream beside the
    forward (the runtime's ``Beside``) at several grids, the post pass after the join; and, as the runtime serves
    a model with a logits module, the post pass forked onto that stream too at the logits (``Beside.fork_post``);
    at the runtime's grid and at one program per SM; and that placement's forks and join with a one-element store
    in place of each pass.
    Served passes (freed-slot mark, status publish), realkv=partial, request-side checks as --request-side says.
    Every variant's replay is timed ``repeats`` times, interleaved with the others; the median per variant."""
    from canary_instrument.runtime.checks.request_side import make_freed_buffer
    from canary_instrument.runtime.passes.status import allocate_status
    from canary_instrument.runtime.step.beside import Beside

    out = []
    for reqs, ctx in BESIDE:
        state, plan, ids = build("mha", "partial", reqs, ctx, pool_rows=4097)
        allocate_status(state, 1024, torch.device(DEV))
        state.freed = make_freed_buffer(state.req_to_token.shape[0], DEV)
        plan.extend_const = 1  # a decode's plan, as the runtime builds it
        forward = StandInForward(reqs, ctx)
        post = make_ops((128, 4, 16))
        beside = Beside(DEV)

        def in_line():
            post.pre_forward(state, plan, ids)
            forward()
            post.post_forward(state, plan)

        def beside_at(per_sm):
            pre = make_ops((128, 4, per_sm))

            def step():
                with beside.fork(plan):
                    pre.pre_forward(state, plan, ids)
                forward()
                beside.join()
                post.post_forward(state, plan)
            return step

        def served(pre_pass, post_pass):
            """The runtime's placement: a second branch from the forward's start (the pre pass) and another at its
            logits (the post pass), joined when the forward returns."""
            def step():
                with beside.fork(plan):
                    pre_pass()
                x = forward.body()
                with beside.fork_post():
                    post_pass()
                forward.logits(x)
                beside.join()
            return step

        def post_at_the_logits_at(per_sm):
            ops = make_ops((128, 4, per_sm))
            return served(lambda: ops.pre_forward(state, plan, ids), lambda: ops.post_forward(state, plan))

        token = torch.zeros(1, dtype=torch.int32, device=DEV)
        # The served placement with a one-element store in place of each pass: what the branches cost the engine's
        # kernels apart from the passes' own work.
        forks_alone = served(lambda: token.add_(1), lambda: token.add_(1))

        variants = {"forward": forward, "in line": in_line}
        variants.update({f"beside, {n}/SM": beside_at(n) for n in BESIDE_PROGRAMS_PER_SM})
        variants["beside, post at the logits"] = post_at_the_logits_at(16)
        # The same with both passes one program per SM: fewer programs beside to hold SMs the engine's kernels wait
        # for, where a pass's dependency chain, not its width, sets its time (small batches).
        variants["beside, post at the logits, 1/SM"] = post_at_the_logits_at(1)
        variants["forks alone, no pass"] = forks_alone
        graphs = {name: graph_of(fn) for name, fn in variants.items()}
        times = {name: [] for name in graphs}
        for _ in range(repeats):
            for name, graph in graphs.items():
                times[name].append(do_bench(graph.replay, warmup=20, rep=200, return_mode="median"))
        base = sorted(times["forward"])[repeats // 2]
        for name in graphs:
            ms = sorted(times[name])[repeats // 2]
            row = dict(reqs=reqs, ctx=ctx, variant=name, ms=ms, added_us=(ms - base) * 1e3,
                       added_pct=100 * (ms - base) / base, spread_us=(max(times[name]) - min(times[name])) * 1e3,
                       violations=int(state.ring_count.reshape(-1)[0]))
            log("beside", row)
            out.append(row)
        del state, plan, forward, graphs
        torch.cuda.empty_cache()
    results["beside"] = out


class _Node:
    """A radix-tree node shaped like sglang's: children by first token, slots in a device tensor."""

    def __init__(self, value=None):
        self.children = {}
        self.value = value
        self.lock_ref = 0


class _Cache:
    def __init__(self, root):
        self.root_node = root


def cached_paths(r2t, edge):
    """A prefix cache holding every request's positions as a chain of ``edge``-slot nodes (device values)."""
    root = _Node([])
    root.lock_ref = 1
    reqs, ctx = r2t.shape
    for r in range(reqs):
        node = root
        for start in range(0, ctx, edge):
            child = _Node(r2t[r, start : start + edge].to(torch.int64))
            node.children[(r, start)] = child
            node = child
    return _Cache(root)


SWEEP_SLICES = (1024, 4096, 16384, 65536)
SWEEP_EDGE = 64  # slots per radix node (sglang's nodes hold one edge of the tree each)


def sweep_cost(results, reqs=64, ctx=1025, slices=SWEEP_SLICES, make_ops=TritonSweepOps):
    """Cost of one idle-cache sweep step: the host's walk and upload of a slice, the kernel that verifies it,
    and the whole step as the runtime runs it (walk, one pinned upload, device gather, launch), per slice size.
    The cache holds reqs x (ctx - 1) positions (default 65,536), rows written and fingerprinted."""
    out = []
    for layout in ("mha", "swa"):
        for realkv in ("none", "partial"):
            state, _, _ = build(layout, realkv, reqs, ctx, window=256)
            cache = cached_paths(state.req_to_token[1:, : ctx - 1], SWEEP_EDGE)  # row 0: the padding row
            for rows in slices:
                sweeper = Sweeper(state, interval=1, slots_per_sweep=rows, ops=make_ops())
                cursor = RadixCursor(cache)
                host = []
                for _ in range(30):
                    start = time.perf_counter()
                    sweeper.send(cursor.next_slice(rows))
                    host.append(time.perf_counter() - start)
                    torch.cuda.synchronize()  # host time only above; do not let uploads pile up
                sweeper.send(RadixCursor(cache).next_slice(rows))
                kernel_ms = bench_graph(lambda: sweeper.ops.sweep(state, sweeper.buffers))
                step = [0]

                def one_step():
                    step[0] += 1
                    sweeper.maybe_sweep(step[0], cache)

                step_ms = do_bench(one_step, warmup=5, rep=100, return_mode="median")
                host_us = sorted(host)[len(host) // 2] * 1e6
                row = dict(layout=layout, realkv=realkv, rows=rows, edge=SWEEP_EDGE, host_us=host_us,
                           kernel_us=kernel_ms * 1e3, step_us=step_ms * 1e3,
                           rows_per_us=rows / (kernel_ms * 1e3), violations=int(state.ring_count[0]))
                log("sweep", row)
                out.append(row)
                reset(state)
            torch.cuda.empty_cache()
    results["sweep"] = out


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for realkv in sorted({r["realkv"] for r in results["scaling"]}):
        rows = [r for r in results["scaling"] if r["realkv"] == realkv]
        labels = [f"{r['reqs']}x{r['ctx']}" for r in rows]
        ax.plot(labels, [r["percent"] for r in rows], marker="o", label=f"canary pre+post, realkv={realkv}")
    ax.axhline(0.5, color="red", linestyle="--", label="bar: 0.5 % of attention KV read")
    ax.set_yscale("log")
    ax.set_xlabel("decode batch (requests x context), Llama-3-8B KV (128 KiB/token)")
    ax.set_ylabel("canary time / attention KV-read time (%)")
    ax.set_title(f"Per-forward canary cost under CUDA-graph replay, {results['device']}")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--only", nargs="*", default=["verify", "write", "reference", "scaling", "sweep", "small", "beside"])
    parser.add_argument("--scaling-realkv", nargs="+", default=["none", "partial", "all"],
                        choices=["none", "partial", "all"], help="real-KV modes of the scaling table")
    # sglang sizes req_to_token by max_running_requests + 1 padding row, 2048-4096 requests by default;
    # the kernels must not cost more for a big pool than for the batch they check.
    parser.add_argument("--pool-rows", type=int, default=4097,
                        help="req-pool capacity (req_to_token rows) of the scaling table's pools")
    parser.add_argument("--layers", type=int, default=LAYERS,
                        help="layers per fingerprinted half (realkv partial/all read them through the layer table)")
    parser.add_argument("--layer-buffers", type=int, default=LAYER_BUFFERS,
                        help="distinct KV buffers behind the layers (the rest alias them round-robin)")
    parser.add_argument("--request-side", action="store_true",
                        help="plans with the target's identity and write-slot checks on (issue 21's cost)")
    parser.add_argument("--layer-chunk", type=int, default=None,
                        help="layers the post pass fingerprints at once (default: the runtime's choice)")
    parser.add_argument("--config", default=None,
                        help="BLOCK,NUM_WARPS,PROGRAMS_PER_SM for every mode instead of tuning (e.g. 128,4,16)")
    parser.add_argument("--kernel-dir", type=Path, default=None,
                        help="time the kernels rendered here (a template variant) instead of the shipped ones")
    parser.add_argument("--shapes", type=int, default=None, help="only the first N shapes of the scaling table")
    parser.add_argument("--shape", action="append", default=None, metavar="REQSxCTX",
                        help="the scaling table's shapes instead of its own (repeatable, e.g. 1x1024)")
    args = parser.parse_args()
    if args.shape:
        SCALING[:] = [tuple(int(v) for v in shape.split("x")) for shape in args.shape]
    if args.shapes:
        del SCALING[args.shapes:]
    globals().update(KERNEL_DIR=args.kernel_dir, LAYERS=args.layers, LAYER_BUFFERS=args.layer_buffers, REQUEST_SIDE=args.request_side,
                     LAYER_CHUNK=args.layer_chunk)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "layers": args.layers, "layer_buffers": args.layer_buffers, "request_side": REQUEST_SIDE,
               "layer_chunk": args.layer_chunk, "config": args.config,
               "kernel_dir": str(args.kernel_dir) if args.kernel_dir else None,
               "command": "PYTHONPATH=$PWD python " + " ".join(sys.argv)}
    start = time.time()
    copy_bw = copy_bandwidth()
    results["copy_tb_s"] = copy_bw / 1e12
    log("copy bandwidth TB/s", copy_bw / 1e12)
    def save():  # after every section, so a run cut short still returns what it measured
        results["seconds"] = time.time() - start
        (args.out / "results.json").write_text(json.dumps(results, indent=2))

    if args.config:
        fixed = tuple(int(v) for v in args.config.split(","))
        verify_config, config = fixed, dict.fromkeys(("none", "partial", "all"), fixed)
    elif set(args.only) & {"verify", "write", "reference", "scaling"}:
        verify_config, config = tune(results, copy_bw)
        save()
    if "write" in args.only:
        write_vs_serial(results, config["none"])
        save()
    if "verify" in args.only:
        verify_bandwidth(copy_bw, results, verify_config)
        save()
    if "scaling" in args.only:
        scaling(copy_bw, results, tuple(args.scaling_realkv), config, args.pool_rows)
        save()
    if "reference" in args.only:
        vs_reference(results, config)
        save()
    if "sweep" in args.only:
        sweep_cost(results)
        save()
    if "small" in args.only:
        small_batches(results)
        save()
    if "beside" in args.only:
        beside_forward(results)
        save()
    if "scaling" in results:
        plot(results, args.out / "scaling.png")
        results["plot"] = "scaling.png"
        save()
    log("done in", results["seconds"], "s")


if __name__ == "__main__":
    main()
