"""Whole canary cost per decode step against the step's physical floor, and the reference engine's own step.

One run, one table per device (files named after it):

(a) Llama-3-8B decode. The floor of a decode step at batch R x C (requests x context) is the time
    to stream the weights (16e9 bytes) and the batch's KV (32 layers x 8 KV heads x 128 x 2 (K, V)
    x 2 bytes = 128 KiB per token) once at the measured copy bandwidth. Beside it, the canary's cost
    per step with realkv=partial: device time of the runtime's pre- and post-forward passes (the
    bracket `install_canary` puts around the model's forward, captured in a CUDA graph as an engine
    captures them, replayed under one decode plan; timed with `triton.testing.do_bench` over a
    graph of `--reps` brackets, over a static forward batch whose tensors the plans are read from),
    host time of the runtime's outside-graph contexts (phase checks, readback) and of its record
    of the sampler's output, measured over real decode steps, and their sum. Canary off
    costs 0 by construction. The KV pool is Llama-shaped with 32 layers per half, as the canary
    attaches them (its pointer table, the fingerprint table of layers 1..31, the rotation), but only
    two distinct buffers back them (layer 0, and layers 1..31 sharing one): realkv=partial reads 16
    bytes of one layer per verified row, so distinct buffers would change the memory needed, and the
    post-forward pass's reads of the aliased layers may hit L2 (a few rows per decode step).

(b) The reference engine (golden/engine, instrumented with the real CLI) with Llama-3-8B's per-layer
    attention shape (8 layers, hidden 2048, 16 query / 8 KV heads x 128, bf16, Triton attention,
    CUDA-graph decode), canary off vs on (log, realkv=partial), alternating rounds of decode steps.
    Per step: wall time with the device synchronised around it (scheduler, sampling, canary host
    work included), and the forward's device time (the graph runner's replay between two CUDA
    events). Its floor: all of its weights plus the KV its attention reads per step, at the copy
    bandwidth.

Bandwidth convention: a device-to-device copy of N bytes moves 2N (read + write);
bandwidth = 2N / time. The floors divide the bytes a step must read by that figure.

(b) needs an instrumented engine, which the CLI makes with libcst. Where libcst is missing (the GPU
machines), prepare it first on a machine that has it; it lands in bench/_work/ (git-ignored, so it
travels as an ignored path) and is checked against the engine and rewriter sources before use:

    PYTHONPATH=. python bench/engine/step_floor.py --prepare-engine
    PYTHONPATH=. python bench/engine/step_floor.py --out bench/engine/results

`--smoke` runs a tiny configuration on CPU (no graphs, torch canary ops, torch attention) so a test
can run the whole script.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from canary_instrument.demo import engine_copy, matrix  # noqa: E402
from canary_instrument.runtime import install_canary, mark_init_finished  # noqa: E402
from canary_instrument.runtime.setup import instance_wrap  # noqa: E402
from tests.runtime.mini_engine import ForwardBatch, ForwardMode  # noqa: E402

DEFAULT_ENGINE_DIR = ROOT / "bench" / "_work" / "step_floor_engine"
SHAPES = ["8x4096", "32x2048", "64x1024", "256x2048"]

# Llama-3-8B: weights as the issue states them; KV per token over all layers.
LLAMA = dict(weight_bytes=16e9, layers=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16)
LLAMA_KV_BYTES_PER_TOKEN = LLAMA["layers"] * LLAMA["kv_heads"] * LLAMA["head_dim"] * 2 * 2
GOAL_PERCENT = 1.0  # whole canary cost per step, % of the Llama floor
ENGINE_GOAL_RATIO = 2.0  # engine step / its own floor

ENGINE_SHAPE = dict(
    vocab_size=32000, hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, dtype="bfloat16", kv_canary_real_kv="partial", speculative_algorithm=None,
    disable_radix_cache=True,
)
SMOKE_ENGINE_SHAPE = dict(ENGINE_SHAPE, vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, dtype="float32")
SMOKE_LLAMA = dict(LLAMA, kv_heads=2, head_dim=16)  # the smoke run's pool rows; the floor keeps Llama's bytes


def log(*args):
    print(*args, flush=True)


# ---------------------------------------------------------------- timing helpers


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy, read + write counted (2 x its size)."""
    nbytes = (1 << 30) if device.type == "cuda" else (1 << 26)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_seconds(lambda: dst.copy_(src), device, reps=20)


def median_seconds(fn, device: torch.device, reps: int = 50) -> float:
    """Median time of fn: triton's do_bench (CUDA events, cache flushed) on a GPU, perf_counter on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=max(100, reps), return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- (a) canary vs the Llama-3-8B floor


class _NoOpModel(torch.nn.Module):
    """Stands for the model between the canary's brackets: the KV is written up front, so the
    graph holds exactly what the canary adds to a decode step."""

    def forward(self, input_ids, positions, forward_batch):
        return None


# Req-pool rows, as sglang sizes req_to_token by default (max_running_requests 2048-4096, plus the
# padding row): the canary must cost no more in a deployment's pool than in one sized to the batch.
POOL_ROWS = 4097


class LlamaKvRunner:
    """What `install_canary` reads from a model runner, with Llama-shaped KV layers and a sampler."""

    def __init__(self, reqs: int, slots_per_req: int, geometry: dict, device: torch.device, seed: int = 0):
        self.server_args = SimpleNamespace(kv_canary="log", kv_canary_real_kv="partial", speculative_num_steps=None,
                                           kv_canary_stats_interval=None)
        self.device = device
        self.is_draft_worker = False
        self.sliding_window_size = None
        size = reqs * slots_per_req
        shape = (size + 1, geometry["kv_heads"], geometry["head_dim"])
        gen = torch.Generator(device=device).manual_seed(seed)
        def layers():
            first, rest = (torch.randn(shape, dtype=geometry["dtype"], device=device, generator=gen) for _ in range(2))
            return [first] + [rest] * (geometry["layers"] - 1)

        self.token_to_kv_pool = SimpleNamespace(k_buffer=layers(), v_buffer=layers())
        # Req-pool row 0 is sglang's padding row; request r uses row r + 1, whose position p sits in
        # slot 1 + r * slots_per_req + p (contiguous pages; slot 0 is padding too).
        slots = torch.arange(1, size + 1, dtype=torch.int32, device=device).view(reqs, slots_per_req)
        table = torch.zeros((max(reqs + 1, POOL_ROWS), slots_per_req), dtype=torch.int32, device=device)
        table[1 : reqs + 1] = slots
        self.req_to_token_pool = SimpleNamespace(req_to_token=table)
        self.model = _NoOpModel()
        self.next_token_ids = torch.zeros(reqs, dtype=torch.int32, device=device)
        self.canary_manager = install_canary(server_args=self.server_args, model_runner=self)

    def sample(self, logits_output, forward_batch):
        """sglang's `ModelRunner.sample` shape: one int32 token per request (set by the bench)."""
        return self.next_token_ids


def canary_step_cost(reqs: int, context: int, device: torch.device, host_steps: int, reps: int,
                     geometry: dict) -> dict:
    """Device and host time the canary adds to one decode step of `reqs` requests at `context` tokens.

    As an engine runs it: the decode forward is a CUDA graph captured over a static forward batch
    (plans are read from its tensors at every replay), the canary's outside-graph context wraps each
    replay, and the sampler's output is recorded through the canary's wrap of `model_runner.sample`.
    """
    slots_per_req = context + host_steps + 1
    runner = LlamaKvRunner(reqs, slots_per_req, geometry, device)
    manager, model = runner.canary_manager, runner.model
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 128_000, (reqs, slots_per_req), generator=gen, dtype=torch.int32)
    rows = torch.arange(1, reqs + 1, dtype=torch.int64, device=device)
    table = runner.req_to_token_pool.req_to_token
    static = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=reqs, req_pool_indices=rows,
        seq_lens=torch.ones(reqs, dtype=torch.int64, device=device),
        input_ids=torch.zeros(reqs, dtype=torch.int64, device=device),
        positions=torch.zeros(reqs, dtype=torch.int64, device=device),
        out_cache_loc=torch.zeros(reqs, dtype=torch.int64, device=device),
    )

    def bracketed():
        model.forward(static.input_ids, static.positions, static)

    graphs = {}
    if device.type == "cuda":
        # Captured before init finishes, as an engine captures: the canary's enable flag is 0 then,
        # and every replay re-reads the static batch's tensors.
        stream = torch.cuda.Stream(device)
        for count in (1, reps):
            graph = torch.cuda.CUDAGraph()
            with manager.with_active_single_forward_manager(0):
                bracketed()  # warm-up (compiles the kernels) outside the capture
                sync(device)
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(count):
                        bracketed()
            graphs[count] = graph
    mark_init_finished(manager)

    # Prefill: positions [0, context - 1) of every request, eagerly through the bracket.
    prefill_len = context - 1
    prefill = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=reqs, req_pool_indices=rows,
        seq_lens=torch.full((reqs,), prefill_len, device=device),
        input_ids=tokens[:, :prefill_len].reshape(-1).long().to(device),
        positions=torch.arange(prefill_len, device=device).repeat(reqs),
        out_cache_loc=table[1 : reqs + 1, :prefill_len].reshape(-1).long(),
        extend_prefix_lens=torch.zeros(reqs, dtype=torch.int32, device=device),
        extend_seq_lens=torch.full((reqs,), prefill_len, dtype=torch.int32, device=device),
    )
    with manager.with_ops_outside_graph([0], prefill), manager.with_active_single_forward_manager(0):
        model.forward(prefill.input_ids, prefill.positions, prefill)
    runner.next_token_ids.copy_(tokens[:, prefill_len])
    runner.sample(None, prefill)  # the prefill's sampled tokens: what the first decode step must carry

    def decode_step(position: int) -> None:
        """Fill the static batch with decode step `position` (the graph runner's copy into its buffers)."""
        static.input_ids.copy_(tokens[:, position])
        static.positions.fill_(position)
        static.seq_lens.fill_(position + 1)
        static.out_cache_loc.copy_(table[1 : reqs + 1, position])
        runner.next_token_ids.copy_(tokens[:, position + 1])

    # Device time: one decode step's plan, the bracket replayed `reps` times in one graph (verify
    # and write are idempotent under one plan), so graph launch cost is spread over the brackets.
    decode_step(context - 1)
    with manager.with_ops_outside_graph([0], static), manager.with_active_single_forward_manager(0):
        if device.type == "cuda":
            device_s = median_seconds(graphs[reps].replay, device) / reps
        else:
            bracketed()  # no graphs on CPU: the eager bracket's own time, once (phases allow one)
            device_s = None
    runner.sample(None, static)

    # Host time of real decode steps: the outside-graph contexts and the sampler wrap's record (the
    # replay between them is async; the sampler's own work is the engine's, not the canary's).
    original_sample = instance_wrap.original(runner.sample)
    host, eager = [], []
    for step in range(1, host_steps + 1):
        decode_step(context - 1 + step)
        outside = manager.with_ops_outside_graph([0], static)
        active = manager.with_active_single_forward_manager(0)
        t0 = time.perf_counter()
        outside.__enter__()
        active.__enter__()
        t1 = time.perf_counter()
        if device.type == "cuda":
            graphs[1].replay()
        else:
            bracketed()
        t2 = time.perf_counter()
        active.__exit__(None, None, None)
        outside.__exit__(None, None, None)
        t3 = time.perf_counter()
        runner.sample(None, static)
        t4 = time.perf_counter()
        original_sample(None, static)
        t5 = time.perf_counter()
        host.append((t1 - t0) + (t3 - t2) + max(0.0, (t4 - t3) - (t5 - t4)))
        eager.append(t2 - t1)
    violations = len(manager.flush())
    stats = manager.stats()
    if device_s is None:
        device_s = statistics.median(eager)
    return dict(
        canary_device_us=round(device_s * 1e6, 2),
        canary_host_us=round(statistics.median(host) * 1e6, 2),
        canary_host_us_p90=round(sorted(host)[int(0.9 * (len(host) - 1))] * 1e6, 2),
        host_steps=host_steps,
        violations=violations,
        verified=stats.verified,
    )


def llama_rows(shapes, device, bandwidth, host_steps, reps, geometry) -> list[dict]:
    rows = []
    for reqs, context in shapes:
        kv_bytes = reqs * context * LLAMA_KV_BYTES_PER_TOKEN
        floor_us = (LLAMA["weight_bytes"] + kv_bytes) / bandwidth * 1e6
        row = dict(requests=reqs, context=context, weight_bytes=LLAMA["weight_bytes"], kv_bytes=kv_bytes,
                   floor_us=round(floor_us, 1), canary_off_us=0.0)
        row.update(canary_step_cost(reqs, context, device, host_steps, reps, geometry))
        free_memory(device)
        total = row["canary_device_us"] + row["canary_host_us"]
        row.update(
            canary_total_us=round(total, 2),
            device_percent_of_floor=round(100 * row["canary_device_us"] / floor_us, 3),
            host_percent_of_floor=round(100 * row["canary_host_us"] / floor_us, 3),
            total_percent_of_floor=round(100 * total / floor_us, 3),
        )
        row["meets_goal"] = row["total_percent_of_floor"] <= GOAL_PERCENT
        log("llama", json.dumps(row))
        rows.append(row)
    return rows


# ---------------------------------------------------------------- (b) the reference engine's own step


def engine_sources_digest() -> str:
    """Hash of everything an instrumented engine copy is made from: the pristine engine and the rewriter."""
    digest = hashlib.sha256()
    package = ROOT / "canary_instrument"
    sources = [(engine_copy.pristine_engine_dir(), f"{engine_copy.ENGINE_PACKAGE}/**/*.py"),
               (package, "rewrite/**/*.py"), (package, "catalog/*.toml")]
    for base, pattern in sources:
        for path in sorted(base.glob(pattern)):
            if "__pycache__" not in path.parts:
                digest.update(path.relative_to(base).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def prepare_engine(dest: Path) -> None:
    """Copy and instrument the engine into `dest` with the real CLI (needs libcst)."""
    if dest.exists():
        shutil.rmtree(dest)
    engine_copy.copy_engine(dest)
    engine_copy.instrument(dest)
    (dest / "SOURCES.sha256").write_text(engine_sources_digest() + "\n")


def instrumented_engine(dest: Path):
    """The instrumented engine's entry module, prepared here when libcst is available."""
    stamp = dest / "SOURCES.sha256"
    if not (stamp.is_file() and stamp.read_text().strip() == engine_sources_digest()):
        try:
            import libcst  # noqa: F401
        except ImportError:
            state = "is stale" if stamp.is_file() else "is missing"
            raise SystemExit(
                f"the instrumented engine in {dest} {state} and libcst is not installed here to make it: run "
                f"`PYTHONPATH=. python bench/engine/step_floor.py --prepare-engine --engine-dir {dest}` on a "
                "machine with libcst and bring that folder along"
            )
        log("instrumenting a copy of the reference engine into", dest)
        prepare_engine(dest)
    return engine_copy.import_engine(dest)


@dataclass
class DeviceTimer:
    """CUDA events around the graph runner's replay: the decode forward's device time."""

    events: list

    @classmethod
    def attach(cls, engine) -> "DeviceTimer":
        timer = cls(events=[])
        runner = engine.model_runner.graph_runner
        if runner is None:
            return timer
        original = runner.replay

        def replay(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = original(*args, **kwargs)
            end.record()
            timer.events.append((start, end))
            return out

        runner.replay = replay
        return timer

    def take_ms(self) -> list[float]:
        torch.cuda.synchronize()
        out = [start.elapsed_time(end) for start, end in self.events]
        self.events.clear()
        return out


def fill(engine, batch: int, context: int, new_tokens: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (context,), generator=gen).tolist(), new_tokens)
    while engine.scheduler.waiting or engine.scheduler.chunked_req is not None:
        engine.step()


def timed_decode_steps(engine, steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        batch = engine.step()
        sync(device)
        if batch is None or not batch.forward_mode.is_decode():
            raise RuntimeError("the measured requests finished or left decode; raise the new-token budget")
        times.append(time.perf_counter() - start)
    return times


def engine_row(module, shape: dict, batch: int, context: int, steps: int, rounds: int, device: torch.device,
               bandwidth: float) -> dict:
    margin = steps * rounds + 64
    args = dict(matrix.ENGINE_DEFAULTS, **shape, attention_layout="mha", device=str(device),
                max_running_requests=batch, cuda_graph_max_bs=batch, max_context_len=context + margin,
                max_total_tokens=batch * (context + margin), chunked_prefill_size=8192)
    engines, timers = {}, {}
    for mode in ("none", "log"):
        engines[mode] = module.Engine(**dict(args, kv_canary=mode))
        fill(engines[mode], batch, context, steps * rounds + 16, shape["vocab_size"], seed=0)
        timed_decode_steps(engines[mode], 5, device)  # warm-up
        if device.type == "cuda":
            timers[mode] = DeviceTimer.attach(engines[mode])
    wall = {"none": [], "log": []}
    forward = {"none": [], "log": []}
    for _ in range(rounds):
        for mode, engine in engines.items():
            wall[mode] += timed_decode_steps(engine, steps, device)
            if mode in timers:
                forward[mode] += timers[mode].take_ms()
    manager = engines["log"].model_runner.canary_manager
    violations = len(manager.flush())
    target = engines["none"].model_runner
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    pool = target.token_to_kv_pool
    kv_bytes_per_token = sum(b[0].numel() * b.element_size() for b in pool.k_buffer + pool.v_buffer)
    mean_context = context + steps * rounds / 2
    kv_bytes = int(batch * mean_context * kv_bytes_per_token)
    floor_ms = (weight_bytes + kv_bytes) / bandwidth * 1e3
    backend = type(target.attn_backend).__name__
    del engines, timers, target, pool, manager
    free_memory(device)

    def ms(values):
        return round(statistics.median(values) * 1e3, 3) if values else None

    off, on = ms(wall["none"]), ms(wall["log"])
    fwd_off = round(statistics.median(forward["none"]), 3) if forward["none"] else None
    fwd_on = round(statistics.median(forward["log"]), 3) if forward["log"] else None
    row = dict(
        requests=batch, context=context, steps_each=len(wall["log"]), attention_backend=backend,
        weight_bytes=weight_bytes, kv_bytes_per_step=kv_bytes, floor_ms=round(floor_ms, 3),
        step_off_ms=off, step_on_ms=on, canary_ms=round(on - off, 3),
        forward_device_off_ms=fwd_off, forward_device_on_ms=fwd_on,
        canary_device_ms=round(fwd_on - fwd_off, 3) if fwd_off is not None else None,
        step_off_over_floor=round(off / floor_ms, 2),
        forward_device_off_over_floor=round(fwd_off / floor_ms, 2) if fwd_off is not None else None,
        violations=violations,
    )
    row["meets_goal"] = row["step_off_over_floor"] <= ENGINE_GOAL_RATIO
    log("engine", json.dumps(row))
    return row


# ---------------------------------------------------------------- report


def markdown(report: dict) -> str:
    bw = report["copy_bandwidth_GBps"]
    lines = [
        f"# Canary cost per decode step vs the step's floor, {report['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']}, triton {report['triton']}. Device-to-device copy: {bw} GB/s "
        "(read + write counted: a copy of N bytes moves 2N). Floors = bytes a step must read / that bandwidth.",
        "",
        "## (a) Llama-3-8B decode step: canary (realkv=partial) vs the physical floor",
        "",
        "Floor = (16e9 B of weights + requests x context x 128 KiB of KV) / copy bandwidth. Canary device = "
        "the runtime's pre- + post-forward passes in a CUDA graph (median per bracket over a graph of "
        f"{report['reps']} brackets); host = its outside-graph contexts per decode step (median of "
        f"{report['host_steps']} steps); canary off = 0. The req pool has {POOL_ROWS} rows, sglang's default "
        f"capacity. Goal: total <= {GOAL_PERCENT} % of the floor.",
        "",
        "| requests x context | KV read (GB) | floor (us) | canary off (us) | canary device (us) | canary host (us) "
        "| canary total (us) | device % of floor | total % of floor | goal | violations |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["llama"]:
        lines.append(
            f"| {r['requests']} x {r['context']} | {r['kv_bytes'] / 1e9:.2f} | {r['floor_us']} | {r['canary_off_us']:g} "
            f"| {r['canary_device_us']} | {r['canary_host_us']} | {r['canary_total_us']} "
            f"| {r['device_percent_of_floor']} | {r['total_percent_of_floor']} "
            f"| {'meets' if r['meets_goal'] else 'MISSES'} | {r['violations']} |"
        )
    if report.get("engine"):
        shape = report["engine_shape"]
        lines += [
            "",
            "## (b) The reference engine's own decode step, canary off / on, vs its own floor",
            "",
            f"Engine: {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
            f"{shape['num_attention_heads']} query / {shape['num_key_value_heads']} KV heads x {shape['head_dim']}, "
            f"{shape['dtype']}, vocab {shape['vocab_size']}; attention backend "
            f"`{report['engine'][0]['attention_backend']}`; canary on = `log`, realkv=partial. Steps alternate "
            f"between the two engines in {report['rounds']} rounds. Step = wall time of `engine.step()` with the "
            "device synchronised around it; forward on device = the decode graph runner's replay between two CUDA "
            "events. Floor = all weights + the KV attention reads per step (mean context over the run), at copy "
            f"bandwidth. Goal: step off <= {ENGINE_GOAL_RATIO:g}x floor.",
            "",
            "| requests x context | weights + KV (GB) | floor (ms) | step off (ms) | step on (ms) | canary (ms) "
            "| forward on device off / on (ms) | step off / floor | forward off / floor | goal | violations |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["engine"]:
            fwd = (f"{r['forward_device_off_ms']} / {r['forward_device_on_ms']}"
                   if r["forward_device_off_ms"] is not None else "n/a (no graphs)")
            lines.append(
                f"| {r['requests']} x {r['context']} | {(r['weight_bytes'] + r['kv_bytes_per_step']) / 1e9:.2f} "
                f"| {r['floor_ms']} | {r['step_off_ms']} | {r['step_on_ms']} | {r['canary_ms']} | {fwd} "
                f"| {r['step_off_over_floor']} | {r['forward_device_off_over_floor']} "
                f"| {'meets' if r['meets_goal'] else 'MISSES'} | {r['violations']} |"
            )
    for shape, reason in report.get("engine_skipped", {}).items():
        lines.append(f"\nEngine shape {shape} skipped: {reason}")
    return "\n".join(lines) + "\n"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke)"


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def parse_shapes(values) -> list[tuple[int, int]]:
    out = []
    for value in values:
        try:
            reqs, context = (int(x) for x in value.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: expected REQUESTSxCONTEXT such as 8x4096, got {value!r}")
        if reqs < 1 or context < 2:
            raise SystemExit(f"--shapes: {value!r} needs at least 1 request and a context of 2")
        out.append((reqs, context))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "engine" / "results")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="decode batches as REQUESTSxCONTEXT")
    parser.add_argument("--engine-shapes", nargs="+", help="(b)'s batches (default: --shapes)")
    parser.add_argument("--host-steps", type=int, default=200, help="(a): decode steps timed on the host")
    parser.add_argument("--reps", type=int, default=20, help="(a): canary brackets per timed graph")
    parser.add_argument("--steps", type=int, default=20, help="(b): decode steps per round and engine")
    parser.add_argument("--rounds", type=int, default=3, help="(b): alternating rounds")
    parser.add_argument("--skip-engine", action="store_true", help="run (a) only")
    parser.add_argument("--engine-dir", type=Path, default=DEFAULT_ENGINE_DIR)
    parser.add_argument("--prepare-engine", action="store_true",
                        help="instrument the engine into --engine-dir (needs libcst) and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU configuration (tests)")
    args = parser.parse_args(argv)

    if args.prepare_engine:
        prepare_engine(args.engine_dir)
        log("prepared", args.engine_dir)
        return 0
    if args.smoke:
        device = torch.device("cpu")
        shapes = parse_shapes(["2x40"])
        engine_shapes = shapes
        geometry, engine_shape = SMOKE_LLAMA, SMOKE_ENGINE_SHAPE
        args.host_steps, args.steps, args.rounds = min(args.host_steps, 5), min(args.steps, 3), min(args.rounds, 2)
    else:
        if not torch.cuda.is_available():
            print("step_floor.py measures CUDA-graph decode steps: it needs a CUDA device (or --smoke)",
                  file=sys.stderr)
            return 2
        device = torch.device("cuda")
        shapes = parse_shapes(args.shapes)
        engine_shapes = parse_shapes(args.engine_shapes or args.shapes)
        geometry, engine_shape = LLAMA, ENGINE_SHAPE
    import triton

    # Fail before measuring anything when (b)'s instrumented engine cannot be had.
    module = None if args.skip_engine else instrumented_engine(args.engine_dir)
    matrix.quiet_canary_log()
    start = time.time()
    bandwidth = copy_bandwidth(device)
    log(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "step_floor_smoke" if args.smoke else f"step_floor_{device_slug(_device_name(device))}"

    def save():  # after every row, so a run cut short still leaves what it measured
        report["seconds"] = round(time.time() - start, 1)
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{stem}.md").write_text(markdown(report))

    report = {
        "command": " ".join(["PYTHONPATH=. python bench/engine/step_floor.py", *(sys.argv[1:] if argv is None else argv)]),
        "device": _device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
        "copy_bandwidth_Bps": bandwidth,
        "bandwidth_convention": "device-to-device copy, read + write counted (2 x bytes copied) / time",
        "host_steps": args.host_steps,
        "reps": args.reps,
        "rounds": args.rounds,
        "llama": [],
        "engine_shape": engine_shape,
        "engine": [],
        "engine_skipped": {},
    }
    for shape in shapes:
        report["llama"] += llama_rows([shape], device, bandwidth, args.host_steps, args.reps, geometry)
        save()
    if module is not None:
        for batch, context in engine_shapes:
            try:
                report["engine"].append(engine_row(module, engine_shape, batch, context, args.steps, args.rounds,
                                                   device, bandwidth))
            except torch.cuda.OutOfMemoryError as exc:  # "where memory allows"
                report["engine_skipped"][f"{batch}x{context}"] = str(exc).splitlines()[0]
                free_memory(device)
            save()
    save()
    log(f"wrote {args.out / stem}.md/.json in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
