"""Full fault-injection matrix and long clean runs on the instrumented reference engine.

Instruments a copy of the pristine engine with the CLI, then for every layout (MHA, MLA,
SWA) x EAGLE (off, on) x applicable fault runs `--trials` randomised trials, and runs
`--clean-steps` clean steps per variant. On CUDA the engine uses CUDA graphs (decode and
EAGLE draft-extend) and the Triton canary kernels. Writes results.json and a markdown
table to --out; exits 1 if any trial was missed or any clean step reported a violation.

    python bench/engine/fault_matrix.py --trials 50 --clean-steps 2000 --out bench/engine/results
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from canary_instrument.demo import engine_copy, matrix  # noqa: E402


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--clean-steps", type=int, default=2000)
    parser.add_argument("--layouts", nargs="+", default=list(matrix.LAYOUTS))
    parser.add_argument("--faults", nargs="+", default=None, help="only these faults (default: all)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting new trials after this long")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    matrix.quiet_canary_log()

    root = Path(tempfile.mkdtemp(prefix="canary-matrix-")) / "engine"
    engine_copy.copy_engine(root)
    engine_copy.instrument(root)
    module = engine_copy.import_engine(root)

    started = time.perf_counter()
    cells = defaultdict(lambda: {"trials": 0, "caught": 0, "delays": [], "reasons": defaultdict(int), "missed": []})
    cleans = {}
    stopped_early = False
    for variant in matrix.all_variants(args.layouts):
        bench = matrix.EngineBench(module, variant)
        clean = bench.clean_run(args.clean_steps, seed=11)
        cleans[variant.label] = {
            "steps": clean.steps,
            "violations": len(clean.violations),
            "first_violations": [v.format() for v in clean.violations[:5]],
            "seconds": round(clean.seconds, 2),
            "stats": vars(clean.stats),
        }
        print(f"{variant.label}: clean {clean.steps} steps, {len(clean.violations)} violations, "
              f"{clean.seconds:.1f} s, {vars(clean.stats)}", flush=True)
        for fault in matrix.faults_for(variant, args.faults):
            cell = cells[(variant.label, fault.name)]
            for trial in range(args.trials):
                if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                    stopped_early = True
                    break
                result = bench.run_trial(fault, seed=10_000 + trial)
                cell["trials"] += 1
                if result.caught:
                    cell["caught"] += 1
                    cell["delays"].append(result.delay)
                    for reason in result.example.reasons:
                        cell["reasons"][reason] += 1
                else:
                    cell["missed"].append({
                        "seed": result.seed,
                        "injection": result.injection.description if result.injection else None,
                        "false_alarms": [v.format() for v in result.false_alarms[:3]],
                    })
            print(f"  {fault.name:<20} {cell['caught']}/{cell['trials']} caught, "
                  f"delay {min(cell['delays'], default='-')}..{max(cell['delays'], default='-')} steps", flush=True)

    elapsed = time.perf_counter() - started
    trials = sum(c["trials"] for c in cells.values())
    caught = sum(c["caught"] for c in cells.values())
    violations = sum(c["violations"] for c in cleans.values())
    report = {
        "command": " ".join(["python"] + sys.argv),
        "device": device_name(),
        "torch": torch.__version__,
        "cuda_graphs": torch.cuda.is_available(),
        "engine": {k: v for k, v in matrix.ENGINE_DEFAULTS.items()},
        "trials_per_cell": args.trials,
        "stopped_early_by_budget": stopped_early,
        "seconds": round(elapsed, 1),
        "total_trials": trials,
        "total_caught": caught,
        "clean": cleans,
        "cells": {f"{v}/{f}": {**c, "reasons": dict(c["reasons"])} for (v, f), c in cells.items()},
    }
    (args.out / "fault_matrix.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "fault_matrix.md").write_text(render_markdown(report, cells, cleans))
    print(f"{caught}/{trials} caught, {violations} violations in clean runs, {elapsed:.0f} s", flush=True)
    return 0 if caught == trials and violations == 0 and trials > 0 else 1


def render_markdown(report, cells, cleans) -> str:
    variants = list(cleans)
    faults = []
    for _, f in cells:
        if f not in faults:
            faults.append(f)
    lines = [
        f"# Fault matrix on {report['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']}, CUDA graphs {'on' if report['cuda_graphs'] else 'off'}, "
        f"{report['total_caught']}/{report['total_trials']} trials caught, {report['seconds']} s.",
        "",
        "Cell: caught/trials, delay in steps (0 = the step of the fault).",
        "",
        "| fault | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
    ]
    for f in faults:
        row = []
        for v in variants:
            c = cells.get((v, f))
            if c is None:
                row.append("n/a")
            else:
                delays = c["delays"] or ["-"]
                row.append(f"{c['caught']}/{c['trials']}, {min(delays)}..{max(delays)}")
        lines.append(f"| {f} | " + " | ".join(row) + " |")
    lines += ["", "| variant | clean steps | violations | prefix hits | evicted | SWA released | drafts accepted |",
              "|---|---|---|---|---|---|---|"]
    for v, c in cleans.items():
        s = c["stats"]
        lines.append(f"| {v} | {c['steps']} | {c['violations']} | {s['prefix_hit_tokens']} | {s['evicted_tokens']} | "
                     f"{s['swa_released_tokens']} | {s['accepted_drafts']}/{s['proposed_drafts']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
