"""Read the archives gpu.sh brought back and write RESULTS.md and results.json beside them.

    python bench/sglang_server/report.py bench/sglang_server/results

Runs on any machine (no torch): the engine logs are the record. Correctness comes from our
canary's own lines (``kv canary installed``, ``kv_canary_stats=``, ``kv_canary violation``,
``kv_canary_perturb=``) and sglang's scheduler lines (``Prefill batch``, ``Decode batch``); the
perturbation score is ``canary_instrument.runtime.perturb.score_log``. Cost is read from the
scheduler's ``Decode batch`` lines inside each shape's ``cost: begin``/``end`` marks: every line
gives the batch over the generation throughput of the last 40 decode steps, the engines of every
way run the same deterministic workload, so the i-th line of a shape covers the same steps in
each of them (the token counts on the lines are checked to agree), and a way's cost is the
median over i of its step time against canary off's at the same i.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from canary_instrument.runtime.perturb import score_log  # noqa: E402
from canary_instrument.runtime.reports.stats import StatsLine  # noqa: E402

DECODE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+), .*?gen throughput \(token/s\): ([\d.]+)")
PREFILL = re.compile(r"Prefill batch, #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+)")
SHAPE = re.compile(r"cost: begin batch (\d+) context (\d+)\n(.*?)cost: end batch", re.S)
# Ways of the cost comparison: archive member stem -> label. "off-again" is a second engine of the
# same code as "off": how far it lands from "off" is the measurement's own noise.
WAYS = {"off": "canary off", "ours": "ours", "upstream": "sglang's own", "off-again": "canary off, again"}


def read_runs(folder: Path) -> dict[str, dict[str, dict]]:
    """suite -> run name -> {"json": dict | None, "log": str}, from every ``*.tar.gz`` in ``folder``."""
    suites: dict[str, dict[str, dict]] = {}
    for archive in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                suite, name = Path(member.name).parts[-2:]
                stem, ext = name.rsplit(".", 1)
                data = tar.extractfile(member).read().decode()
                run = suites.setdefault(suite, {}).setdefault(stem, {"json": None, "log": ""})
                run["json" if ext == "json" else "log"] = json.loads(data) if ext == "json" else data
    return suites


def prefill_graph(meta: dict) -> str:
    argv = meta.get("argv", [])
    if "--prefill-graph" in argv:
        choice = argv[argv.index("--prefill-graph") + 1]
    else:  # the first correctness suite spelled sglang's default as --piecewise
        choice = "default" if "--piecewise" in argv else "disabled"
    return "breakable (sglang's default)" if choice == "default" else choice


def correctness_row(name: str, run: dict) -> dict:
    meta, log = run["json"] or {}, run["log"]
    stats = StatsLine.find_all(log)
    prefills = PREFILL.findall(log)
    row = {
        "run": name, "ok": bool(meta.get("ok")), "error": meta.get("error"),
        "layout": meta.get("layout"), "model": meta.get("model"), "draft": meta.get("draft"),
        "prefill_graph": prefill_graph(meta), "perturb": meta.get("perturb"),
        "installed_lines": log.count("kv canary installed:"), "stats_lines": len(stats),
        # EAGLE logs two managers' stats (target and draft): the target's is the one whose step
        # equals its pre-forward passes.
        "forwards": max((s.step for s in stats if s.pre_runs == s.step), default=0),
        "prefill_batches": len(prefills), "decode_log_lines": len(DECODE.findall(log)),
        "cached_tokens": sum(int(c) for _, c in prefills), "new_prefill_tokens": sum(int(n) for n, _ in prefills),
        "requests": meta.get("requests"), "generated_tokens": meta.get("generated_tokens"),
        "violation_lines": log.count("kv_canary violation:"),
        "engine_start_s": meta.get("engine_start_s"), "serve_s": meta.get("serve_s"),
    }
    # Forwards that were not prefill batches are decode (or target-verify) steps.
    row["decode_steps"] = row["forwards"] - row["prefill_batches"] if row["forwards"] else 0
    if meta.get("perturb"):
        row["score"] = score_log(log).to_dict()
        armed = _armed_kinds(log)
        if armed:  # kinds the run did not arm (added to the runtime since) have no row
            row["score"]["kinds"] = {k: v for k, v in row["score"]["kinds"].items() if k in armed}
    return row


def _armed_kinds(log: str) -> set:
    """The perturbation kinds the run's ``kv_canary perturb: enabled k=rate, ...`` line names (empty: none found)."""
    found = re.search(r"kv_canary perturb: enabled (.*?) \(seed", log)
    return {item.split("=")[0].strip() for item in found.group(1).split(",")} if found else set()


def shape_intervals(log: str) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(batch, context) -> [(tokens on the line, ms per decode step)] for the full-batch lines."""
    out = {}
    for m in SHAPE.finditer(log):
        batch, context = int(m.group(1)), int(m.group(2))
        out[(batch, context)] = [(int(tokens), batch / float(tput) * 1e3)
                                 for running, tokens, tput in DECODE.findall(m.group(3)) if int(running) == batch]
    return out


def cost_table(runs: dict[str, dict]) -> list[dict]:
    intervals = {way: shape_intervals(runs[way]["log"]) for way in WAYS if way in runs}
    diff = {way: {(s["batch"], s["context"]): s for s in runs[way]["json"]["shapes"]} for way in intervals}
    rows = []
    for shape, base in intervals["off"].items():
        row = {"batch": shape[0], "context": shape[1], "intervals": len(base)}
        base_ms = [ms for _, ms in base]
        # Canary off's steady-state step: the median of the lower half of its lines (the others
        # straddle two runs and hold idle time). Every way's step is that times its paired change.
        steady = statistics.median(sorted(base_ms)[: len(base_ms) // 2 + 1])
        for way in intervals:
            lines = intervals[way][shape]
            if [t for t, _ in lines] != [t for t, _ in base]:
                raise SystemExit(f"report: {way} {shape}: its decode lines do not cover the same steps as off's")
            ms = [m for _, m in lines]
            change = statistics.median((m - b) / b for m, b in zip(ms, base_ms))
            row[way] = {
                "step_ms": round(steady * (1 + change), 4),
                "tokens_per_s": round(shape[0] / (steady * (1 + change)) * 1e3, 1),
                "vs_off_pct": round(change * 100, 3),
                "vs_off_us": round(statistics.median((m - b) * 1e3 for m, b in zip(ms, base_ms)), 1),
                "difference_method_ms": diff[way][shape]["step_ms"],
            }
        rows.append(row)
    return rows


def markdown(suites: dict, correctness: list[dict], cost: list[dict], device: str) -> str:
    out = ["<!-- generated by bench/sglang_server/report.py from the archives in this folder; do not edit -->",
           "# Real sglang with the canary: results", "",
           f"Device: {device}. Release: sglang {first_meta(suites).get('sglang')} (unmodified for canary off "
           "and sglang's own canary; a copy rewritten by `canary-instrument apply` for ours), random weights "
           "(`--load-format dummy`), `--attention-backend triton`, CUDA graphs on, radix cache on, chunked prefill on.",
           "", "## Correctness (ours, `--kv-canary log --kv-canary-real-data partial`)", "",
           "| run | model | prefill graph | target forwards | decode steps | requests | tokens generated | "
           "prefix tokens reused | `installed` lines | stats lines | violations |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in correctness:
        model = r["model"] + (f" + {r['draft']}" if r["draft"] else "")
        status = "" if r["ok"] else f" (failed: {r['error']})"
        out.append(f"| {r['run']}{status} | {model} | {r['prefill_graph']} | {r['forwards']} | {r['decode_steps']} | "
                   f"{r['requests']} | {r['generated_tokens']} | {r['cached_tokens']} | {r['installed_lines']} | "
                   f"{r['stats_lines']} | {r['violation_lines']} |")
    out += ["", "## Self-test perturbations (every kind armed at rate 0.02, sweep every 16 steps)", "",
            "| run | kind | injected | reported | missed | delay min/median/max (steps) |", "|---|---|---|---|---|---|"]
    for r in correctness:
        if "score" not in r:
            continue
        for kind, k in r["score"]["kinds"].items():
            delay = "-" if k["delay_min"] is None else f"{k['delay_min']}/{k['delay_median']:g}/{k['delay_max']}"
            out.append(f"| {r['run']} | {kind} | {k['injected']} | {k['reported']} | {len(k['missed'])} | {delay} |")
        s = r["score"]
        out.append(f"| {r['run']} | **all** | {s['injected']} | {s['reported']} | {s['injected'] - s['reported']} | "
                   f"violations {s['violations']}, unattributed {len(s['unattributed'])}, "
                   f"not applied {s['not_applied']} |")
    out += ["", "## Cost per decode step (Llama-3-8B, 32 layers, bf16)", "",
            "Each cell: ms per decode step (tokens/s) and, in brackets, the median change against canary "
            "off over the same 40-step intervals (per interval, then the median). Canary off's step is its "
            "steady state (the median of the lower half of its intervals; the others straddle two runs), "
            "every other way's is that step times its change. *canary off, again* is a second engine of "
            "the unmodified release: its distance from *canary off* is the noise of the measurement.", "",
            "| batch x context | " + " | ".join(WAYS[w] for w in WAYS if w in cost[0]) + " |",
            "|---|" + "---|" * sum(w in cost[0] for w in WAYS)]
    for r in cost:
        cells = []
        for way in WAYS:
            if way not in r:
                continue
            c = r[way]
            delta = "" if way == "off" else f" [{c['vs_off_pct']:+.2f} %, {c['vs_off_us']:+.0f} us]"
            cells.append(f"{c['step_ms']:.3f} ms ({c['tokens_per_s']:.0f}/s){delta}")
        out.append(f"| {r['batch']} x {r['context']} | " + " | ".join(cells) + " |")
    out += ["", "The same runs by the difference method (wall time of a 208-token run minus a 16-token run "
            "over the same cached prompts, / 192; median of 4), ms per step:", "",
            "| batch x context | " + " | ".join(WAYS[w] for w in WAYS if w in cost[0]) + " |",
            "|---|" + "---|" * sum(w in cost[0] for w in WAYS)]
    for r in cost:
        out.append(f"| {r['batch']} x {r['context']} | "
                   + " | ".join(f"{r[w]['difference_method_ms']:.3f}" for w in WAYS if w in r) + " |")
    return "\n".join(out) + "\n"


def first_meta(suites: dict) -> dict:
    for runs in suites.values():
        for run in runs.values():
            if run["json"]:
                return run["json"]
    return {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    suites = read_runs(args.folder)
    correctness = [correctness_row(name, run) for suite in sorted(suites) if suite.startswith("correctness")
                   for name, run in sorted(suites[suite].items()) if run["json"]]
    cost_runs = {name: run for suite in ("cost-a", "cost-b") for name, run in suites.get(suite, {}).items()}
    cost = cost_table(cost_runs) if "off" in cost_runs else []
    device = (args.folder / "device.txt").read_text().strip() if (args.folder / "device.txt").exists() else "?"
    (args.folder / "results.json").write_text(json.dumps({"device": device, "correctness": correctness,
                                                          "cost": cost}, indent=1) + "\n")
    (args.folder / "RESULTS.md").write_text(markdown(suites, correctness, cost, device))
    print(f"wrote {args.folder / 'RESULTS.md'} and results.json")


if __name__ == "__main__":
    main()
