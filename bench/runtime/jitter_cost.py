"""What timing jitter costs per decode step of the instrumented reference engine: off, and on.

A copy of the reference engine is instrumented with the real CLI (as `step_overhead.py` does) and
built once per jitter setting, canary on (log mode, real-KV partial); `bs` requests are prefilled,
then decoded, replaying CUDA graphs on CUDA as sglang does (the jitter launches are recorded in
them). Per setting: the median and p90 wall time of a scheduler decode step (the step ends in the
engine's own device-to-host read of the sampled tokens, so it covers the device work), the jitter
kernels the device ran per step (from the jitter's own device counters), the jitter kernels a
torch.profiler pass saw (kernels named `jitter_wait`), and the microseconds drawn per step.

Settings (`--max-us`): 0 is off (nothing installed: the figure to compare with the canary alone);
1 measures the mechanism (launches and a wait of at most 1 us per point); larger values add waits
of 0..max_us per point, about max_us / 2 on average.

    PYTHONPATH=$PWD python bench/runtime/jitter_cost.py --device cuda --bs 8 64 --out $OUT/jitter_cost.json
    PYTHONPATH=. python bench/runtime/jitter_cost.py --steps 30 --bs 4 --max-us 0 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import step_overhead  # noqa: E402

def _kernels_seen(case, steps: int) -> float:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            case.step()
    return sum(e.count for e in prof.key_averages() if "jitter_wait" in e.key) / steps


def run(module, bs: int, max_us: int, points: str, steps: int, warmup: int, profile_steps: int, device: str,
        graphs: bool) -> dict:
    settings = {"SGLANG_KV_CANARY_JITTER_MAX_US": str(max_us), "SGLANG_KV_CANARY_JITTER_POINTS": points,
                "SGLANG_KV_CANARY_JITTER_SEED": "0"}
    with step_overhead.matrix.scoped_environ(settings):  # read at install
        case = step_overhead.Case(module, bs, 1, True, warmup + steps + profile_steps, device, graphs)
    jitters = [m.jitter for m in case.managers if m.jitter is not None]
    for _ in range(warmup):
        case.step()
    launches_before = sum(sum(j.counts().values()) for j in jitters)
    drawn_before = sum(sum(j.totals_us().values()) for j in jitters)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        case.step()
        times.append(time.perf_counter() - t0)
    launches = (sum(sum(j.counts().values()) for j in jitters) - launches_before) / steps
    drawn = (sum(sum(j.totals_us().values()) for j in jitters) - drawn_before) / steps
    seen = _kernels_seen(case, profile_steps) if profile_steps else None
    found = [v for m in case.managers for v in m.flush()]
    if found:
        raise RuntimeError(f"the clean benchmark run reported {len(found)} violations: {found[0].format()}")
    ordered = sorted(times)
    return dict(bs=bs, max_us=max_us, points=points if max_us else "-", steps=steps,
                step_us=round(statistics.median(times) * 1e6, 1),
                step_p90_us=round(ordered[int(len(ordered) * 0.9)] * 1e6, 1),
                jitter_launches_per_step=launches, jitter_kernels_profiled_per_step=seen,
                drawn_us_per_step=round(drawn, 1), installed=bool(jitters))


def markdown(rows) -> str:
    lines = ["| bs | max_us | points | step (us, median) | step p90 (us) | added to off (us, median) | "
             "jitter launches per step (device counters) | jitter_wait kernels per step (profiler) | "
             "drawn per step (us) |", "|---|---|---|---|---|---|---|---|---|"]
    off = {r["bs"]: r["step_us"] for r in rows if r["max_us"] == 0}
    for r in rows:
        added = round(r["step_us"] - off[r["bs"]], 1) if r["bs"] in off else ""
        lines.append(f"| {r['bs']} | {r['max_us']} | {r['points']} | {r['step_us']} | {r['step_p90_us']} | {added} | "
                     f"{r['jitter_launches_per_step']:g} | {r['jitter_kernels_profiled_per_step']} | "
                     f"{r['drawn_us_per_step']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--max-us", type=int, nargs="+", default=[0, 1, 20],
                        help="SGLANG_KV_CANARY_JITTER_MAX_US per run; 0 = off")
    parser.add_argument("--points", default="all", help="SGLANG_KV_CANARY_JITTER_POINTS for the runs with jitter on")
    parser.add_argument("--profile-steps", type=int, default=10, help="steps under torch.profiler (0: none)")
    step_overhead.add_run_options(parser)
    args = parser.parse_args(argv)
    module = step_overhead.start_engine(args, "canary-jitter-cost-")
    rows = []
    for bs in args.bs:
        for max_us in args.max_us:
            rows.append(run(module, bs, max_us, args.points, args.steps, args.warmup, args.profile_steps,
                            args.device, graphs=not args.disable_cuda_graph))
            print(markdown(rows).splitlines()[-1], flush=True)
    step_overhead.save_results(args.out, args.device, not args.disable_cuda_graph, rows, markdown(rows))

if __name__ == "__main__":
    main()
