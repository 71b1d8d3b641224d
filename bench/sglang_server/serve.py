"""Drive one real sglang engine (``sglang.Engine``) with random weights: a correctness workload or the cost shapes.

    python bench/sglang_server/serve.py correctness --layout mha --out r.json [--perturb 0.02] [--prefill-graph default]
    python bench/sglang_server/serve.py cost --out r.json [--kv-canary log]
    python bench/sglang_server/serve.py stall --out r.json [--kv-canary log]
    python bench/sglang_server/serve.py evict --out r.json --pool-tokens 4096 [--kv-canary log]

Which sglang runs is whatever ``import sglang`` finds: ``gpu.sh`` puts the applied copy first on
``PYTHONPATH`` for our canary and the unmodified release for canary off and sglang's own canary, and
this script records which one it got. ``sglang.Engine`` is the server's own stack (tokenizer
manager, scheduler process, model runner, CUDA graphs, radix cache) without the HTTP front end; it
takes token ids directly, which a dummy-weight model with no tokenizer needs. The engine's log
(the scheduler process writes to this process's stderr) is the record the report is made from.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import write_model  # noqa: E402
from turns import Turns  # noqa: E402

LAYOUTS = {
    # layout -> (model, draft model or None)
    "mha": ("llama3-8b-4l", None),
    "mla": ("deepseek-v2-lite-4l", None),
    "swa": ("gpt-oss-20b-4l", None),
    "eagle": ("llama3-8b-4l", "llama3-8b-eagle"),
    # multi-layer EAGLE: three MTP draft layers, one draft runner (and KV pool) per step (models.py)
    "mtp": ("step3p5-dense-4l", "step3p5-dense-mtp3"),
}
# Engine arguments a layout needs beyond its models.
LAYOUT_ARGS = {
    # Step-3.5's MTP layer is a sliding-window one, and sglang's Triton backend leaves the window's KV indices
    # unset in the multi-layer EAGLE draft-extend CUDA graph (triton_backend.py, the DRAFT_EXTEND_V2 branch:
    # the capture fails compiling its extend kernel; sgl-project/sglang#24481, closed unfixed): the drafts
    # attend with FlashInfer, which plans the window there, and the target stays on Triton.
    "mtp": {"speculative_draft_attention_backend": "flashinfer"},
}
# Cost shapes (batch, context): contexts from 1k to 8k at every batch that fits one H100 with the
# 32-layer Llama-3-8B (128 KiB of KV per token); the same for Llama-3.2-1B (32 KiB per token).
COST_SHAPES = [(1, 1024), (1, 8192), (8, 1024), (8, 8192), (64, 1024), (64, 4096), (256, 1024)]
POOL_TOKENS = 16384  # the correctness and evict workloads' pool: small enough that the radix cache evicts


def nccl_port() -> int:
    """A free port below Linux's ephemeral range for the engine's torch.distributed rendezvous.

    sglang's default is ``get_free_port()``: a port the kernel hands out for a bind to port 0, released
    at once and bound again later by the scheduler. Engines started together (gpu.sh runs up to a
    dozen at once) drew the same one (EADDRINUSE at ``init_process_group``); a random pick from a
    range the kernel never hands out by itself makes that rare.
    """
    import socket

    rng = random.SystemRandom()
    while True:
        port = rng.randrange(20000, 30000)  # sglang's own ports start at 30000; ephemeral ones at 32768
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def engine_args(args, model_path: Path, draft_path: Path | None) -> dict:
    kw = dict(
        model_path=str(model_path),
        nccl_port=nccl_port(),
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend=args.attention_backend,
        sampling_backend="pytorch",
        grammar_backend="none",
        random_seed=args.seed,
        kv_canary=args.kv_canary,
        kv_canary_real_data=args.real_data,
        mem_fraction_static=args.mem_fraction,
        log_level="info",
    )
    if args.prefill_graph != "default":
        # sglang's default prefill graph is the breakable one; tc_piecewise is the torch.compile
        # backend that sglang's own canary refuses at install.
        kw["cuda_graph_backend_prefill"] = args.prefill_graph
    if args.kv_canary_sweep_interval:
        kw["kv_canary_sweep_interval"] = args.kv_canary_sweep_interval
    if args.tp > 1:  # tensor parallel: one scheduler process and one canary manager per GPU
        kw["tp_size"] = args.tp
    if args.hicache:  # the host tier under the radix cache: evicted prefixes are written back, then loaded
        kw["enable_hierarchical_cache"] = True
    if draft_path is not None:
        kw.update(speculative_algorithm="EAGLE", speculative_draft_model_path=str(draft_path),
                  speculative_draft_load_format="dummy", speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4)
    return kw


def which_sglang() -> dict:
    import sglang

    runner = Path(sglang.__file__).parent / "srt" / "model_executor" / "model_runner.py"
    return {"sglang": sglang.__version__, "path": str(Path(sglang.__file__).parent),
            "wired_by_canary_instrument": "canary_instrument.runtime" in runner.read_text()}


def correctness(args) -> dict:
    """Waves of requests with shared prefixes, chunked prefill and a pool small enough to evict."""
    import sglang

    model, draft = LAYOUTS[args.layout]
    root = Path(args.models)
    kw = engine_args(args, write_model(model, root), write_model(draft, root) if draft else None)
    kw.update(max_total_tokens=args.pool_tokens, chunked_prefill_size=512, max_running_requests=48,
              cuda_graph_max_bs_decode=48, **LAYOUT_ARGS.get(args.layout, {}))
    rng = random.Random(args.seed)
    vocab = 32000
    prefixes = [[rng.randrange(1, vocab) for _ in range(rng.randint(48, 1024))] for _ in range(12)]
    t0 = time.perf_counter()
    engine = sglang.Engine(**kw)
    started = time.perf_counter() - t0
    requests = generated = waves = planned_steps = 0
    t0 = time.perf_counter()
    while planned_steps < args.decode_steps:
        n = rng.randint(4, 32)
        prompts, params = [], []
        for _ in range(n):
            prefix = rng.choice(prefixes) if rng.random() < 0.8 else []
            cut = rng.randint(len(prefix) // 2, len(prefix)) if prefix else 0
            prompts.append(prefix[:cut] + [rng.randrange(1, vocab) for _ in range(rng.randint(1, 256))])
            params.append({"max_new_tokens": rng.randint(8, 200), "temperature": 0.0, "ignore_eos": True})
        out = engine.generate(input_ids=prompts, sampling_params=params)
        generated += sum(len(o["output_ids"]) for o in out)
        requests += n
        waves += 1
        planned_steps += max(p["max_new_tokens"] for p in params)
    tail = drain(engine, args, prefixes, draft is not None)
    served = time.perf_counter() - t0
    engine.shutdown()
    return {"kind": "correctness", "layout": args.layout, "model": model, "draft": draft,
            "perturb": args.perturb, "prefill_graph": args.prefill_graph, "pool_tokens": args.pool_tokens,
            "waves": waves, "requests": requests, "generated_tokens": generated, **tail,
            "engine_start_s": round(started, 1), "serve_s": round(served, 1)}


def sweep_tail_steps(pool: int, slots: int, interval: int) -> int:
    """Target forwards after the last injection in which the idle-cache sweep ends the pass under way and makes
    one whole pass more over a cache of at most ``pool`` slots.

    A sweep slice hands out at most ``slots`` rows and visits at most ``slots`` nodes (``radix_walk.RadixCursor``);
    every cached node holds a slot, so a pass over ``pool`` slots in at most ``pool`` nodes and the root takes at
    most ``pool // slots + (pool + 1) // slots + 1`` slices (a cache that walks itself, ``ceil(pool / slots)``).
    The first slice after the last injection runs within ``interval`` steps, the next ones ``interval`` apart:
    the rest of the pass under way and a whole pass take at most twice a pass's slices. Nothing reuses a cached
    prefix in the tail, so the tree changes only where the tail's own tokens evict (a watched flip then logs
    ``kv_canary_perturb_left_cache=``), and a slot behind the cursor is reached by the next pass."""
    per_pass = pool // slots + (pool + 1) // slots + 1
    return interval * (2 * per_pass + 1)


def sweep_slots() -> int:
    """The sweep's slice size as the scheduler reads it (the canary's settings: a variable, else its default).
    Asked only where ours serves, so the runtime is on the path."""
    from canary_instrument.runtime.setup.settings import load_settings

    return load_settings().sweep_slots


def pool_size(engine, asked: int) -> int:
    """The scheduler's own KV pool size (``max_total_tokens``, which the engine may have lowered), else ``asked``."""
    try:
        return int(engine.get_server_info()["max_total_num_tokens"])
    except Exception:  # noqa: BLE001 - an engine that does not say: the size asked for
        return asked


def drain(engine, args, prefixes: list, speculative: bool) -> dict:
    """Read every cached prefix once more, so that a corrupted slot the cache still holds is read by a request
    (and its report lands) before the engine stops; then, with perturbations armed and the sweep on, stop
    arming them (``SGLANG_KV_CANARY_PERTURB_STOP_FILE``) and serve a tail long enough for the idle-cache sweep
    to read every slot the cache still holds (``sweep_tail_steps``): a flip in a cached slot that no request
    reuses is read by the sweep before the run ends, not left for a pass the run never made."""
    engine.generate(input_ids=[p + [1] for p in prefixes],
                    sampling_params={"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    stop = os.environ.get("SGLANG_KV_CANARY_PERTURB_STOP_FILE")
    if not (args.perturb and stop and args.kv_canary_sweep_interval and args.kv_canary != "none"):
        return {}
    pool = pool_size(engine, args.pool_tokens)
    slots = sweep_slots()
    steps = sweep_tail_steps(pool, slots, args.kv_canary_sweep_interval)
    # The engine is idle here (generate returned): no forward runs between the drain and the stop.
    Path(stop).touch()
    # One request no cached prefix starts like (every prompt token is >= 1), so it locks, splits and reads no
    # cached node. Each target forward makes one token, an EAGLE verify up to its draft tokens plus one: ask
    # for that many per step, so that the tail has at least ``steps`` target forwards.
    per_step = 4 if speculative else 1  # speculative_num_draft_tokens (engine_args)
    print(f"serve: drain done; perturbations stopped; sweep tail of {steps} steps "
          f"(pool {pool}, {slots} slots a slice, a slice every {args.kv_canary_sweep_interval} steps)",
          file=sys.stderr, flush=True)
    out = engine.generate(input_ids=[[0]], sampling_params={"max_new_tokens": steps * per_step, "temperature": 0.0,
                                                             "ignore_eos": True})
    Path(stop).unlink(missing_ok=True)  # the scheduler stays stopped once it has seen it
    return {"sweep_tail": {"steps": steps, "pool": pool, "slots": slots, "interval": args.kv_canary_sweep_interval,
                           "tokens": len(out[0]["output_ids"])}}


def cost(args) -> dict:
    """Per decode step time per shape, two ways from the same runs.

    Each shape's prompts are prefilled once (one new token), and one short run warms the batch
    size up (kernels compiled for it, graphs replayed once); the timed runs then reuse the prompts
    from the radix cache and extend one token. (a) Difference: a run of N1 and one of N2 new
    tokens differ by exactly N2 - N1 decode steps of the whole batch, every fixed cost (submission,
    the one-token extend, return) cancelling out. (b) The scheduler's own figure: its
    ``Decode batch`` lines (every 40 decode steps) give the batch over the generation throughput
    of each interval; ``report.py`` reads them between this run's ``cost: begin``/``end`` marks.

    With ``--turns``, this engine is one of several alive on the machine (turns.py): each shape's warm-up and
    each of its reps wait for this engine's turn. ``--pool-tokens`` then caps the pool so that they all fit.
    """
    turns = Turns.parse(args.turns, args.turn)
    try:
        return measure_cost(args, turns)
    except BaseException:
        turns.stop()
        raise


def measure_cost(args, turns: Turns) -> dict:
    import sglang

    root = Path(args.models)
    kw = engine_args(args, write_model(args.model, root), None)
    kw.update(max_running_requests=256, cuda_graph_bs_decode=sorted({b for b, _ in COST_SHAPES}),
              chunked_prefill_size=8192)
    if args.pool_tokens:
        kw["max_total_tokens"] = args.pool_tokens
    t0 = time.perf_counter()
    engine = sglang.Engine(**kw)
    started = time.perf_counter() - t0
    shapes = []
    for batch, context in COST_SHAPES:
        rng = random.Random(batch * 100003 + context)
        prompts = [[rng.randrange(1, 128000) for _ in range(context)] for _ in range(batch)]

        def run(new_tokens: int) -> float:
            params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
            t = time.perf_counter()
            out = engine.generate(input_ids=prompts, sampling_params=params)
            elapsed = time.perf_counter() - t
            short = [len(o["output_ids"]) for o in out if len(o["output_ids"]) != new_tokens]
            if short:  # the step count the difference rests on would be wrong
                raise RuntimeError(f"cost: {len(short)} requests stopped before {new_tokens} tokens: {short[:4]}")
            return elapsed

        with turns.turn():
            run(1)
            run(args.short)
        steps = []
        for rep in range(args.reps):
            with turns.turn():
                if rep == 0:
                    print(f"cost: begin batch {batch} context {context}", file=sys.stderr, flush=True)
                short, long_ = run(args.short), run(args.long)
                if rep == args.reps - 1:
                    print(f"cost: end batch {batch} context {context}", file=sys.stderr, flush=True)
            steps.append((long_ - short) / (args.long - args.short))
        step = statistics.median(steps)
        shapes.append({"batch": batch, "context": context, "step_ms": round(step * 1e3, 4),
                       "step_ms_reps": [round(s * 1e3, 4) for s in steps],
                       "tokens_per_s": round(batch / step, 1)})
        print(f"cost: batch {batch} context {context}: {step * 1e3:.3f} ms/step", file=sys.stderr, flush=True)
    engine.shutdown()
    return {"kind": "cost", "model": args.model, "kv_canary": args.kv_canary, "real_data": args.real_data, "reps": args.reps,
            "short": args.short, "long": args.long, "pool_tokens": args.pool_tokens,
            "turn": args.turn if args.turns else None,
            "engine_start_s": round(started, 1), "shapes": shapes}


def stall(args) -> dict:
    """Each batch bucket reached for the first time in an eager decode: decode graphs only for batch 1, then
    waves of 2, 4, ... 256 requests (every power of two a plan width can take), each decoding 32 tokens.
    The scheduler logs every decode step (``decode_log_interval=1``): report.py takes the largest step from
    those lines; the waves' wall times are recorded here. Run it with an empty Triton cache
    (``TRITON_CACHE_DIR``), as on a machine that never compiled the canary's kernels."""
    import sglang

    model, _ = LAYOUTS["mha"]
    kw = engine_args(args, write_model(model, Path(args.models)), None)
    kw.update(max_running_requests=256, cuda_graph_bs_decode=[1], chunked_prefill_size=8192, decode_log_interval=1)
    t0 = time.perf_counter()
    engine = sglang.Engine(**kw)
    started = time.perf_counter() - t0
    rng = random.Random(args.seed)
    waves = []
    for batch in [1, 2, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256]:
        prompts = [[rng.randrange(1, 32000) for _ in range(rng.randint(16, 128))] for _ in range(batch)]
        params = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
        print(f"stall: begin batch {batch}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=params)
        waves.append({"batch": batch, "wave_s": round(time.perf_counter() - t, 3)})
        print(f"stall: end batch {batch}", file=sys.stderr, flush=True)
    engine.shutdown()
    return {"kind": "stall", "kv_canary": args.kv_canary, "engine_start_s": round(started, 1), "waves": waves}


# The evict workload (``serve.py evict``): sizes in tokens, see ``evict_plan``.
EVICT_HELD = 64  # the held request's prompt: the node it locks, the slots the bug frees under it
EVICT_MARGIN = 64  # what stays between each allocation and the point where it would have to evict
EVICT_FILL_MAX = 512  # each cached prompt's length at most (one per prefill, a chunk or less)


def evict_plan(pool: int, chunk: int, seed: int = 1) -> dict:
    """The requests of the evict workload for a pool of ``pool`` slots and a prefill chunk of ``chunk`` tokens.

    sglang's ``RadixCache.evict`` pops the least recently used unlocked leaf and, once a popped leaf's parent
    has no children left, pushes the parent, if it is unlocked (``radix_evict_locked_parent`` drops that test).
    A running request locks the node of its whole prompt (``cache_unfinished_req`` after its prefill), so a
    locked parent with an evictable child needs a second request whose prompt extends the first's and that
    finished, and an allocation that asks more of the cache than every leaf older than that child:

    1. *held* (``EVICT_HELD`` tokens, ``a_new`` decode tokens) is prefilled and decodes on: it locks its
       prompt's node L;
    2. *child* = held's prompt + 1 token, one new token: it matches L, and finishes at its prefill; its insert
       hangs the node C (its own token, and one more where the overlap scheduler gave it a decode slot) under
       L. C is the oldest leaf from now on, L as old (that insert touched it last);
    3. *fills*: prompts nothing else starts like, one new token each: cached whole when they finish, younger
       than C, and they leave ``left`` slots free (less what held has decoded by then);
    4. *new*: one chunk of new tokens. Its prefill allocates ``chunk`` slots where at most ``left`` are free:
       ``evict_from_tree_cache`` asks the cache for ``chunk - free >= EVICT_HELD + EVICT_MARGIN`` tokens. C
       goes first; L, now childless, is pushed only with the bug, older than every fill, so it goes next:
       its slots are freed while held still decodes over them, and the allocator hands them to new (freed
       slots join the free list's end, after the ``free`` slots new takes first; new takes C's, all of L's,
       then some of the oldest fill's). Held's next decode step reads new's KV at its prompt positions.

    Nothing evicts before new's prefill: held decodes at most ``a_new = left - EVICT_MARGIN`` tokens, so
    every fill's prefill and every decode step finds free slots (``EVICT_MARGIN`` of them at least, room for
    the slots the overlap scheduler holds a step longer). sglang admits new: it needs ``chunk + n_new + 1`` of
    free plus evictable slots less held's remaining tokens at the new-token ratio (0.7 at most), which the
    sizes keep (``admission_margin``, the worst case). Held's decode then lasts ``a_new`` steps, seconds on a
    GPU, against the few round trips the client makes before new.
    """
    held, margin = EVICT_HELD, EVICT_MARGIN
    left = chunk - held - margin
    a_new = left - margin
    fill_total = pool - held - 1 - left
    n_new = 4
    # sglang admits new while chunk + n_new + 1 < free + evictable - 0.7 x held's remaining decode (schedule_policy
    # PrefillAdder.add_one_req, rem_total_tokens); the worst case: held has decoded everything it will.
    admission_margin = (pool - held - a_new) - (chunk + n_new + 1)
    if a_new < 4 * margin or fill_total < 1 or admission_margin < 1:
        raise ValueError(f"evict: a pool of {pool} slots and a chunk of {chunk} tokens leave no room for the "
                         f"workload (left {left}, held's decode {a_new}, fills {fill_total}, admission "
                         f"margin {admission_margin}): the pool needs about twice the chunk")
    rng = random.Random(seed)
    first = iter(range(1, 1000))  # every prompt's first token its own: no prompt starts like another

    def prompt(length: int) -> list[int]:
        return [next(first)] + [rng.randrange(1000, 32000) for _ in range(length - 1)]

    held_prompt = prompt(held)
    count = -(-fill_total // EVICT_FILL_MAX)
    sizes = [fill_total // count + (i < fill_total % count) for i in range(count)]
    return {"pool": pool, "chunk": chunk, "left": left, "a_new": a_new, "n_new": n_new,
            "admission_margin": admission_margin, "held": held_prompt,
            "child": held_prompt + [rng.randrange(1000, 32000)], "fills": [prompt(n) for n in sizes],
            "new": prompt(chunk)}


def evict(args) -> dict:
    """One locked parent evicted under a running request, if the release's eviction lets it (``evict_plan``).

    MHA, chunked prefill at half the pool (``--pool-tokens``), so that one prefill asks the cache for more
    than every leaf older than the locked node's child. The client waits for each step's answer before the
    next (held's first streamed token: its prompt is in the cache and locked; the child's and the fills'
    completion: their inserts are done), so the cache's order of events is the plan's. Held decodes to its
    end after new; then the engine idles a few seconds (sglang's idle checks run) and stops."""
    import asyncio

    import sglang

    model, _ = LAYOUTS["mha"]
    kw = engine_args(args, write_model(model, Path(args.models)), None)
    chunk = args.pool_tokens // 2
    kw.update(max_total_tokens=args.pool_tokens, chunked_prefill_size=chunk, max_running_requests=48,
              cuda_graph_max_bs_decode=48)
    t0 = time.perf_counter()
    engine = sglang.Engine(**kw)
    started = time.perf_counter() - t0
    pool = pool_size(engine, args.pool_tokens)
    plan = evict_plan(pool, chunk, args.seed)
    marks: dict = {}

    def params(n: int) -> dict:
        return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}

    def mark(what: str, **facts) -> None:
        marks[what] = facts
        print(f"evict: {what} " + " ".join(f"{k}={v}" for k, v in facts.items()), file=sys.stderr, flush=True)

    async def scenario() -> None:
        decoded, first, done = [0], asyncio.Event(), asyncio.Event()
        stream = await engine.async_generate(input_ids=plan["held"], sampling_params=params(plan["a_new"]),
                                             stream=True)

        async def follow() -> None:
            async for chunk_out in stream:
                decoded[0] = int(chunk_out.get("meta_info", {}).get("completion_tokens")
                                 or len(chunk_out.get("output_ids", [])))
                first.set()
            done.set()

        held = asyncio.ensure_future(follow())
        await first.wait()
        mark("held prefilled", prompt=len(plan["held"]), decoded=decoded[0])
        await engine.async_generate(input_ids=plan["child"], sampling_params=params(1))
        mark("child cached", decoded=decoded[0])
        await engine.async_generate(input_ids=plan["fills"], sampling_params=params(1))
        mark("fills cached", fills=len(plan["fills"]), tokens=sum(map(len, plan["fills"])), decoded=decoded[0])
        await engine.async_generate(input_ids=plan["new"], sampling_params=params(plan["n_new"]))
        mark("new served", prompt=len(plan["new"]), decoded=decoded[0], held_running=not done.is_set())
        await held
        mark("held done", decoded=decoded[0])

    t0 = time.perf_counter()
    engine.loop.run_until_complete(scenario())
    served = time.perf_counter() - t0
    time.sleep(args.evict_idle_s)  # sglang's idle checks (its pool and tree accounting) run now
    engine.shutdown()
    new = marks["new served"]
    return {"kind": "evict", "pool_tokens": pool, "chunk": chunk,
            "plan": {k: plan[k] for k in ("left", "a_new", "n_new", "admission_margin")},
            "fills": [len(f) for f in plan["fills"]], "marks": marks,
            # The route's precondition: held was still decoding when new was served (so when its prefill evicted).
            "route_held": bool(new["held_running"]),
            "engine_start_s": round(started, 1), "serve_s": round(served, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["correctness", "cost", "stall", "evict"])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="mha")
    parser.add_argument("--kv-canary", default="log", choices=["none", "log", "raise"])
    parser.add_argument("--real-data", default="partial", choices=["none", "partial", "all"])
    parser.add_argument("--perturb", type=float, default=0.0, help="arm every self-test perturbation at this rate")
    parser.add_argument("--kv-canary-sweep-interval", type=int, default=0)
    parser.add_argument("--prefill-graph", default="disabled", choices=["disabled", "default", "tc_piecewise"],
                        help="prefill CUDA graph backend (default: sglang's own choice, the breakable graph)")
    parser.add_argument("--attention-backend", default="triton", choices=["triton", "flashinfer"])
    parser.add_argument("--hicache", action="store_true", help="enable sglang's hierarchical (host-tier) cache")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (GPUs)")
    parser.add_argument("--decode-steps", type=int, default=2500)
    parser.add_argument("--pool-tokens", type=int, default=None,
                        help=f"the KV pool's tokens (correctness and evict: default {POOL_TOKENS}; cost: as much as "
                             "--mem-fraction leaves)")
    parser.add_argument("--mem-fraction", type=float, default=0.85)
    parser.add_argument("--model", default="llama3-8b", choices=["llama3-8b", "llama3.2-1b"], help="the cost model")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--short", type=int, default=16)
    parser.add_argument("--long", type=int, default=208)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--turns", type=Path, default=None,
                        help="cost: the file several engines take their turns by (turns.py); gpu.sh writes 0 there")
    parser.add_argument("--turn", default="0/1", help="cost, with --turns: this engine's turn, INDEX/COUNT")
    parser.add_argument("--evict-idle-s", type=float, default=3.0,
                        help="evict: seconds the engine idles after the last request, before it stops")
    parser.add_argument("--models", default=os.environ.get("SGLANG_SERVER_MODELS", "/tmp/sglang-server/models"))
    args = parser.parse_args()
    if args.pool_tokens is None and args.what in ("correctness", "evict"):
        args.pool_tokens = POOL_TOKENS
    if args.perturb:
        os.environ["SGLANG_KV_CANARY_PERTURB"] = f"all={args.perturb}"
        os.environ.setdefault("SGLANG_KV_CANARY_PERTURB_SEED", str(args.seed))
        # The scheduler stops arming perturbations once this file exists (the drain creates it): outside the runs
        # folder that gpu.sh archives, one per process (one left from an earlier run would stop them at once).
        stop = Path(tempfile.gettempdir()) / f"kv-canary-perturb-stop-{os.getpid()}"
        stop.unlink(missing_ok=True)
        os.environ["SGLANG_KV_CANARY_PERTURB_STOP_FILE"] = str(stop)
    os.environ.setdefault("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "100")
    result = {"argv": sys.argv[1:], **which_sglang()}
    if args.what == "correctness":
        model, draft = LAYOUTS[args.layout]
        result.update(layout=args.layout, model=model, draft=draft)
    # Written first, and again at the end: sglang's teardown of a scheduler that fails at start kills this
    # process too, and the report still learns what ran.
    args.out.write_text(json.dumps({**result, "ok": False, "error": "killed before it finished"}, indent=1) + "\n")
    try:
        result.update({"correctness": correctness, "cost": cost, "stall": stall, "evict": evict}[args.what](args))
        result["ok"] = True
    except Exception as exc:  # the report shows the failure; gpu.sh goes on with the next run
        import traceback

        traceback.print_exc()
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
