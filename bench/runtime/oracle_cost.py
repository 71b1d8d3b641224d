"""What the token oracle costs per decode step of the instrumented reference engine: off against on.

A copy of the reference engine is instrumented with the real CLI (as `step_overhead.py` does) and built
per setting, canary on (log mode, real-KV partial), the oracle off or on
(`SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE`); `bs` requests are prefilled, then decoded, replaying CUDA graphs
on CUDA (the oracle's input check is recorded in them). Per setting: the median and p90 wall time of a
scheduler decode step (it ends in the engine's own device-to-host read of the sampled tokens, so it covers
the device work) and the canary's host time in the step (wired sites, allocator notes and the sampler
wrap, timed as `step_overhead.py` times them). Settings alternate (off, on, off, on) so that two runs of
one setting show the noise.

    PYTHONPATH=$PWD python bench/runtime/oracle_cost.py --device cuda --bs 8 64 256 --out $OUT/oracle_cost.json
    PYTHONPATH=. python bench/runtime/oracle_cost.py --steps 20 --bs 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import step_overhead  # noqa: E402

ORACLE_VAR = "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"


def run(module, bs: int, oracle: bool, steps: int, warmup: int, device: str, graphs: bool) -> dict:
    os.environ[ORACLE_VAR] = "1" if oracle else "0"
    case = step_overhead.Case(module, bs, 1, True, warmup + steps, device, graphs)
    installed = [m.token_oracle is not None for m in case.managers]
    if installed != [oracle] * len(installed):
        raise RuntimeError(f"the oracle is {'not ' if oracle else ''}installed where this run asked otherwise")
    for _ in range(warmup):
        case.step()
    times, host = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        sites, sample, *_ = case.step()
        times.append(time.perf_counter() - t0)
        host.append(sites + sample)
    found = [v for m in case.managers for v in m.flush()]
    if found:
        raise RuntimeError(f"the clean benchmark run reported {len(found)} violations: {found[0].format()}")
    ordered = sorted(times)
    return dict(bs=bs, oracle=oracle, steps=steps, step_us=round(statistics.median(times) * 1e6, 1),
                step_p90_us=round(ordered[int(len(ordered) * 0.9)] * 1e6, 1),
                host_us=round(statistics.median(host) * 1e6, 2))


def markdown(rows) -> str:
    lines = ["| bs | oracle | step (us, median) | step p90 (us) | canary host time in the step (us, median) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bs']} | {'on' if r['oracle'] else 'off'} | {r['step_us']} | {r['step_p90_us']} | "
                     f"{r['host_us']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=200, help="timed decode steps per run")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="(off, on) pairs per batch size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here (and .md beside it)")
    args = parser.parse_args(argv)
    saved = os.environ.get(ORACLE_VAR)
    if args.device == "cpu":
        torch.set_num_threads(1)
    module = step_overhead.timed_engine("canary-oracle-cost-")
    rows = []
    try:
        for bs in args.bs:
            for _ in range(args.rounds):
                for oracle in (False, True):
                    rows.append(run(module, bs, oracle, args.steps, args.warmup, args.device,
                                    graphs=not args.disable_cuda_graph))
                    print(markdown(rows).splitlines()[-1], flush=True)
    finally:
        if saved is None:
            os.environ.pop(ORACLE_VAR, None)
        else:
            os.environ[ORACLE_VAR] = saved
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else platform.processor() or platform.machine())
    table = markdown(rows)
    print(table)
    if args.out:
        meta = dict(device=args.device, device_name=device_name, torch=torch.__version__, command=" ".join(sys.argv),
                    cuda_graphs=args.device == "cuda" and not args.disable_cuda_graph,
                    time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        args.out.with_suffix(".md").write_text(f"Machine: {device_name} ({args.device}), torch {torch.__version__}; "
                                               f"`{meta['command']}`\n\n{table}\n")


if __name__ == "__main__":
    main()
