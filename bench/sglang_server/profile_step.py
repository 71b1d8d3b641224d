"""Where the canary's time goes in a real sglang decode step: sglang's own profiler, then a per-step summary.

    python bench/sglang_server/profile_step.py run --out DIR [--kv-canary none|log] [--batch 1] [--context 1024]
    python bench/sglang_server/profile_step.py analyse TRACE... [--json OUT]

``run --no-stack`` leaves Python stacks out: the host columns are then empty, but the profiler's own cost
per Python call no longer slows the host (with stacks, a step at 8 requests waited on the host, so its
device figures were of another step than the timed one's).

``run`` (on the GPU machine; which sglang runs is whatever ``import sglang`` finds, as for ``serve.py``)
starts ``sglang.Engine`` with the 32-layer Llama-3-8B as ``serve.py cost`` does, a decode CUDA graph for
``--batch`` only, prefills the prompts once, warms up, then has sglang's scheduler profile ``--steps``
forwards of a decode run (``Engine.start_profile(num_steps=..., activities=["CPU", "GPU"],
with_stack=True)``: a torch profiler trace, ``*.trace.json.gz``, written by the scheduler into DIR), and
analyses it.

``analyse`` reads chrome traces (json or json.gz) and reports, per decode step (the median over steps):

- the step: the time between consecutive ``cudaGraphLaunch`` calls of the thread that replays the decode
  graph (one replay per decode step);
- the canary's host time: the outermost Python frames of ``canary_instrument/`` on that thread (with
  ``with_stack`` every Python call is an event; nested ones are inside their caller's time), less the
  ``sglang/`` frames they call (a wrapper's original: the engine's sampler runs inside ours);
- what the canary's own code sends to the device outside the graph: CUDA runtime calls made inside its
  frames but not in the engine code they call (launches, copies, synchronisations), and the aten ops among
  them that read a device value to the host (``aten::item``, ``aten::_local_scalar_dense``);
- the device time of the canary's kernels per step: its own (``canary_*``, inside the graph or not) and what
  those launches ran (matched by correlation id: a copy launched by the canary's code is the canary's), and
  per kernel name how many launches a step makes and their time;
- the device's busy time per step (every kernel, copy and memset, summed: work beside other work counts
  twice): a step that grew by more than the device work it gained waited on the host; and every kernel's
  launches and time per step (the longest ``TOP_KERNELS``), so two ways' summaries show which of the engine's
  kernels a canary slowed;
- the replayed graph on the device: from the first kernel the step's ``cudaGraphLaunch`` ran to the end of its
  last (matched by correlation id). Once launched, a graph's kernels wait on nothing but each other, so this is
  the forward's device time, the canary's passes inside it included, beside or in line, and the host's speed
  does not reach it;
- the canary functions taking the most host time per step.

The analysis needs no torch: it runs on any machine over a trace brought back.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

CANARY_FRAME = "canary_instrument/"
# The engine's own code called through a canary wrapper (the wrapped ``ModelRunner.sample``, a bracketed
# forward): inside a canary frame, but its time and its calls are the engine's.
ENGINE_FRAME = "sglang/"
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
# A host read of a device value is one aten::_local_scalar_dense (under aten::item, .tolist(), int(t), ...);
# an explicit wait is a cuda*Synchronize call.
SYNCS = ("Synchronize", "aten::_local_scalar_dense")
TOP_KERNELS = 40


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def outermost(frames: list[dict]) -> list[dict]:
    """The frames not inside another of the list (one thread's events, any order)."""
    out: list[dict] = []
    for e in sorted(frames, key=lambda e: (e["ts"], -e["dur"])):
        if out and e["ts"] < out[-1]["ts"] + out[-1]["dur"]:  # starts inside the last outermost frame
            continue
        out.append(e)
    return out


class Spans:
    """The outermost of some frames of one thread; ``e in spans``: ``e`` lies inside one of them."""

    def __init__(self, frames: list[dict]):
        self.frames = outermost(frames)
        self.starts = [f["ts"] for f in self.frames]

    def __iter__(self):
        return iter(self.frames)

    def __contains__(self, e: dict) -> bool:
        i = bisect.bisect_right(self.starts, e["ts"]) - 1
        return i >= 0 and e["ts"] + e["dur"] <= self.frames[i]["ts"] + self.frames[i]["dur"]


def analyse(events: list[dict], top: int = 15) -> dict:
    """The per-step summary of one trace (see the module docstring)."""
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"]
    if len(launches) < 2:
        raise ValueError("fewer than two cudaGraphLaunch calls: no decode step to measure")
    by_thread = defaultdict(list)
    for e in launches:
        by_thread[(e["pid"], e["tid"])].append(e)
    thread = max(by_thread, key=lambda t: len(by_thread[t]))  # the thread replaying the decode graph
    starts = sorted(e["ts"] for e in by_thread[thread])
    on_thread = [e for e in events if (e["pid"], e["tid"]) == thread]
    python = [e for e in on_thread if e.get("cat") == "python_function"]
    canary = Spans([e for e in python if CANARY_FRAME in e["name"]])
    engine = Spans([e for e in python if ENGINE_FRAME in e["name"] and CANARY_FRAME not in e["name"] and e in canary])

    def step_of(ts: float) -> int | None:
        i = bisect.bisect_right(starts, ts) - 1
        return i if 0 <= i < len(starts) - 1 else None

    steps = len(starts) - 1
    host = [0.0] * steps
    calls = [defaultdict(lambda: [0, 0.0]) for _ in range(steps)]
    functions: dict[str, float] = defaultdict(float)
    for frames, sign in ((canary, 1), (engine, -1)):  # the canary's frames, less the engine code they called
        for f in frames:
            s = step_of(f["ts"])
            if s is not None:
                host[s] += sign * f["dur"]
    launched = set()  # correlation ids of the launches the canary's own code made
    for e in on_thread:
        s = step_of(e["ts"])
        if s is None:
            continue
        if e.get("cat") == "python_function" and CANARY_FRAME in e["name"]:
            functions[e["name"]] += e["dur"]  # inclusive, nested calls included in each caller
        elif e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op") and e in canary and e not in engine:
            if e.get("cat") == "cpu_op" and not any(k in e["name"] for k in SYNCS):
                continue
            calls[s][e["name"]][0] += 1
            calls[s][e["name"]][1] += e["dur"]
            if "correlation" in e.get("args", {}):
                launched.add(e["args"]["correlation"])
    # Each step's graph replay: the device span of the kernels its cudaGraphLaunch ran (one correlation id).
    replay_step = {e["args"]["correlation"]: step_of(e["ts"]) for e in by_thread[thread]
                   if "correlation" in e.get("args", {})}
    spans: dict[int, tuple[float, float]] = {}
    device = [0.0] * steps  # the canary's kernels: its own (canary_*, in the graph or not) and what its code launched
    busy = [0.0] * steps  # all device work: a slower step that is not busier waited on the host
    kernels: dict[str, list] = defaultdict(lambda: [0, 0.0])  # the canary's, by name: count and time, all steps
    every: dict[str, list] = defaultdict(lambda: [0, 0.0])  # every device work item, by name: count and time
    for e in events:
        if e.get("cat") in DEVICE_WORK:
            replay = replay_step.get(e.get("args", {}).get("correlation"))
            if replay is not None:
                first, last = spans.get(replay, (e["ts"], e["ts"] + e["dur"]))
                spans[replay] = (min(first, e["ts"]), max(last, e["ts"] + e["dur"]))
            s = step_of(e["ts"])  # device work runs after its launch, within the step that launched it or just after
            if s is None:
                continue
            busy[s] += e["dur"]
            every[e["name"]][0] += 1
            every[e["name"]][1] += e["dur"]
            if e["name"].startswith("canary_") or e.get("args", {}).get("correlation") in launched:
                device[s] += e["dur"]
                kernels[e["name"]][0] += 1
                kernels[e["name"]][1] += e["dur"]
    step_us = [b - a for a, b in zip(starts, starts[1:])]
    names = sorted({n for c in calls for n in c})
    return {
        "steps": steps,
        "step_us": statistics.median(step_us),
        "canary_host_us": statistics.median(host),
        "canary_device_us": statistics.median(device),
        "device_busy_us": statistics.median(busy),
        "graph_us": statistics.median(b - a for a, b in spans.values()) if spans else None,
        # Mean per step: how many launches of each canary kernel a step makes, and their time.
        "canary_kernels_per_step": {n: {"launches": c / steps, "us": t / steps} for n, (c, t) in sorted(kernels.items())},
        # Every kernel (the engine's too), the longest first: mean launches and time per step.
        "kernels_per_step": {n: {"launches": c / steps, "us": t / steps}
                             for n, (c, t) in sorted(every.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]},
        # Median per step, and the run's total count: a call made once every N steps has a median of 0.
        "calls_in_canary_frames": {n: {"per_step": statistics.median(c[n][0] for c in calls),
                                       "us_per_step": statistics.median(c[n][1] for c in calls),
                                       "total": sum(c[n][0] for c in calls)} for n in names},
        "syncs_per_step": statistics.median(sum(c[n][0] for n in c if any(k in n for k in SYNCS)) for c in calls),
        "top_functions_us_per_step": dict(sorted(((n, t / steps) for n, t in functions.items()),
                                                 key=lambda kv: -kv[1])[:top]),
    }


def table(name: str, s: dict) -> str:
    lines = [f"{name}: {s['steps']} decode steps, median step {s['step_us']:.1f} us; canary host "
             f"{s['canary_host_us']:.1f} us, canary kernels {s['canary_device_us']:.1f} us, device busy "
             f"{s.get('device_busy_us', float('nan')):.1f} us, graph on the device "
             f"{s.get('graph_us') or float('nan'):.1f} us, syncs {s['syncs_per_step']:g} per step"]
    for kernel, k in s.get("canary_kernels_per_step", {}).items():
        lines.append(f"  {kernel:<40} {k['launches']:>5g} per step {k['us']:>8.1f} us  (device)")
    for call, c in s["calls_in_canary_frames"].items():
        lines.append(f"  {call:<40} {c['per_step']:>5g} per step {c['us_per_step']:>8.1f} us  ({c['total']} in all)")
    for fn, us in s["top_functions_us_per_step"].items():
        lines.append(f"  {us:>8.1f} us  {fn}")
    return "\n".join(lines)


def run(args) -> None:
    import random

    import sglang

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import write_model
    from serve import engine_args

    # One folder per way and shape: the scheduler names its trace by a time stamp, and the summary reads them all.
    out = args.out / f"{args.kv_canary}-{args.batch}x{args.context}"
    out.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(attention_backend="triton", seed=1, kv_canary=args.kv_canary, real_data="partial",
                            mem_fraction=0.85, prefill_graph="disabled", kv_canary_sweep_interval=0, hicache=False,
                            tp=1)
    kw = engine_args(ns, write_model(args.model, Path(args.models)), None)
    # As serve.py cost (where the batch-1 figure was measured): a 256-request pool, a decode graph for the batch.
    kw.update(max_running_requests=256, cuda_graph_bs_decode=[args.batch], chunked_prefill_size=8192)
    engine = sglang.Engine(**kw)
    rng = random.Random(args.batch * 100003 + args.context)
    prompts = [[rng.randrange(1, 128000) for _ in range(args.context)] for _ in range(args.batch)]
    params = {"temperature": 0.0, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 1})
    engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 32})
    # record_shapes off: sglang turns it on unless told, and it adds host time to every op, the canary's too.
    engine.start_profile(output_dir=str(out), num_steps=args.steps, activities=["CPU", "GPU"],
                         with_stack=not args.no_stack, record_shapes=False)
    engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": args.steps + 16})
    engine.shutdown()
    summary = {f"{args.kv_canary}/{t.name}": {**analyse(load_events(t)), "stacks": not args.no_stack}
               for t in sorted(out.glob("*.trace.json*"))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, s in summary.items():
        print(table(name, s))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--kv-canary", default="log", choices=["none", "log"])
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--context", type=int, default=1024)
    r.add_argument("--steps", type=int, default=64)
    r.add_argument("--model", default="llama3-8b", help="a model of models.py (its config, random weights)")
    r.add_argument("--no-stack", action="store_true", help="profile without Python stacks (no host attribution)")
    r.add_argument("--models", default=os.environ.get("SGLANG_SERVER_MODELS", "/tmp/sglang-server/models"))
    a = sub.add_parser("analyse")
    a.add_argument("traces", type=Path, nargs="+")
    a.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.what == "run":
        return run(args)
    summary = {str(t): analyse(load_events(t)) for t in args.traces}
    for name, s in summary.items():
        print(table(name, s))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
