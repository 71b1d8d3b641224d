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
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from canary_instrument.runtime.perturb import score_log  # noqa: E402
from canary_instrument.runtime.reports.stats import StatsLine  # noqa: E402
from canary_instrument.runtime.reports.summary import SummaryLine  # noqa: E402
from canary_instrument.runtime.reports.violations import Violation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bugs import BUGS, RETIRED  # noqa: E402

BUG_NAMES = {**RETIRED, **{name: bug.what for name, bug in BUGS.items()}}

DECODE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+), .*?gen throughput \(token/s\): ([\d.]+)")
PREFILL = re.compile(r"Prefill batch, #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+)")
SHAPE = re.compile(r"cost: begin batch (\d+) context (\d+)\n(.*?)cost: end batch", re.S)
# Ways of the cost comparison: archive member stem -> label. "off-again" and "ours-again" are second engines of
# the same code as "off" and "ours": how far they land from their first is the measurement's own noise.
WAYS = {"off": "canary off", "ours": "ours", "upstream": "sglang's own", "off-again": "canary off, again",
        "ours-again": "ours, again", "ours-none": "ours' copy, canary off"}
# Suites whose runs are correctness rows (also a run named fi-*: FlashInfer's attention, in the corpus suite).
CORRECTNESS_SUITES = ("correctness", "correctness2", "gate", "attrib")
# A suite another release ran (gpu.sh with SGLANG_RELEASE=0.5.14): its archive's folder is "0.5.14-gate" and so on.
OTHER_RELEASE = re.compile(r"^(\d+(?:\.\d+)+)-")
GPU_SH = "bash bench/sglang_server/gpu.sh"


def commands(suites, wanted, device: str = "?") -> str:
    """The gpu.sh calls that made the archives of ``wanted`` (suite names) found in ``suites``: one per release and
    machine (another release's archives are named ``0.5.14-SUITE``, made with SGLANG_RELEASE=0.5.14), each naming
    its machine when they differ (``device``: the machine of archives that carry none)."""
    calls: dict[tuple[str, str], list[str]] = {}
    for suite in sorted(s for s in suites if OTHER_RELEASE.sub("", s) in wanted):
        other = OTHER_RELEASE.match(suite)
        key = (other.group(1) if other else "", suites[suite].get(DEVICE, device).split(",")[0])
        calls.setdefault(key, []).append(OTHER_RELEASE.sub("", suite))
    several = len({machine for _, machine in calls}) > 1
    out = [f"`{f'SGLANG_RELEASE={release} ' if release else ''}{GPU_SH} {' '.join(names)}`"
           + (f" ({machine})" if several else "") for (release, machine), names in sorted(calls.items())]
    return f"Command{'s' if len(out) > 1 else ''}: {'; '.join(out)}." if out else ""


def read_runs(folder: Path) -> dict[str, dict[str, dict]]:
    """suite -> run name -> {"json": dict | None, "log": str, "watch": dict | None}, from every ``*.tar.gz``
    in ``folder``; a suite's ``device.txt`` (archives since the gate suite carry one) under the key DEVICE."""
    suites: dict[str, dict[str, dict]] = {}
    for archive in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not member.isfile():
                    continue
                suite, name = Path(member.name).parts[-2:]
                data = tar.extractfile(member).read().decode()
                runs = suites.setdefault(suite, {})
                if name == "device.txt":
                    runs[DEVICE] = machine(data)
                    continue
                kind = "watch" if name.endswith(".watch.json") else "json" if name.endswith(".json") else "log"
                stem = name.removesuffix(".watch.json").removesuffix(".json").removesuffix(".log")
                run = runs.setdefault(stem, {"json": None, "log": "", "watch": None})
                run[kind] = data if kind == "log" else json.loads(data)
    return suites


DEVICE = "device.txt"  # a suite's device, among its runs


def machine(device_txt: str) -> str:
    """A device.txt (nvidia-smi's line per GPU) as one line: a machine of several like GPUs as "2 x GPU"."""
    lines = [line.strip() for line in device_txt.strip().splitlines() if line.strip()]
    if len(lines) > 1 and len(set(lines)) == 1:
        return f"{len(lines)} x {lines[0]}"
    return "; ".join(lines)


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
        "attention": _argument(meta, "--attention-backend", "triton"),
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
        row["score"] = perturb_score(log)
        # Runs whose drain stops the perturbations and serves the sweep's tail (serve.py ``drain``); older ones have
        # neither, and their rows stay as they were.
        stopped = [int(m) for m in STOPPED.findall(log)]
        if stopped:
            row["perturb_stopped_at"] = min(stopped)
            row["injected_after_stop"] = sum(int(m) > min(stopped) for m in INJECTED_STEP.findall(log))
        if meta.get("sweep_tail"):
            row["sweep_tail"] = meta["sweep_tail"]
    return row


def perturb_score(log: str) -> dict:
    """A perturbed run's score (``score_log``), with a row only for the kinds the run armed (kinds added to the
    runtime since it ran have none)."""
    score = score_log(log).to_dict()
    armed = _armed_kinds(log)
    if armed:
        score["kinds"] = {k: v for k, v in score["kinds"].items() if k in armed}
    return score


# The runtime's line when a run's stop file appeared (serve.py's drain), and each injection line's step.
STOPPED = re.compile(r"kv_canary_perturb_stopped= step=(\d+)")
INJECTED_STEP = re.compile(r"kv_canary_perturb= step=(\d+)")


def tail_notes(rows: list[dict]) -> list[str]:
    """One line per perturbed run whose drain stopped the perturbations and served the sweep's tail: from which
    step nothing was injected, how long the tail was, and that no injection came after the stop."""
    out = []
    for r in rows:
        if "perturb_stopped_at" not in r:
            continue
        tail = r.get("sweep_tail") or {}
        out.append(f"- `{r['run']}`: perturbations stopped at step {r['perturb_stopped_at']:,} (after the drain); "
                   f"{r['injected_after_stop']} injections after it; then a sweep tail of {tail.get('steps', '?')} "
                   f"steps ({tail.get('pool', '?')}-slot pool, {tail.get('slots', '?')} slots a slice, a slice every "
                   f"{tail.get('interval', '?')} steps; its request made {tail.get('tokens', '?')} tokens).")
    return ["", *out] if out else []


# The perturbation table's columns after its lead ones (``score_rows``).
SCORE_HEADER = ("injected | reported (% of readable) | missed | evicted unread | delay min/median/max (steps) |",
                "---|---|---|---|---|")


def score_rows(score: dict, lead: str) -> list[str]:
    """The perturbation table's rows of one score: a row per kind, then **all**; ``lead`` opens each row. A miss
    whose slot left the prefix cache before anything read it (its ``kv_canary_perturb_left_cache=`` line; archives
    from before that line have none) is *evicted unread*, and the share reported is over the other injections."""
    out = []
    for kind, k in score["kinds"].items():
        delay = "-" if k["delay_min"] is None else f"{k['delay_min']}/{k['delay_median']:g}/{k['delay_max']}"
        evicted = len(k.get("evicted_unread", ()))
        readable = k["injected"] - evicted
        share = f" ({100 * k['reported'] / readable:.0f} %)" if readable else ""
        out.append(f"| {lead}{kind} | {k['injected']} | {k['reported']}{share} | {len(k['missed'])} | {evicted} | "
                   f"{delay} |")
    evicted = score.get("evicted_unread", 0)
    out.append(f"| {lead}**all** | {score['injected']} | {score['reported']} | "
               f"{score['injected'] - score['reported'] - evicted} | {evicted} | "
               f"violations {score['violations']}, unattributed {score['unattributed']}, "
               f"not applied {score['not_applied']} |")
    return out


def _argument(meta: dict, flag: str, default: str) -> str:
    argv = meta.get("argv", [])
    return argv[argv.index(flag) + 1] if flag in argv else default


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
            change = paired_change(ms, base_ms)
            row[way] = {
                "step_ms": round(steady * (1 + change), 4),
                "tokens_per_s": round(shape[0] / (steady * (1 + change)) * 1e3, 1),
                "vs_off_pct": round(change * 100, 3),
                "vs_off_us": round(statistics.median((m - b) * 1e3 for m, b in zip(ms, base_ms)), 1),
                "difference_method_ms": diff[way][shape]["step_ms"],
            }
        row["verdict_pct"] = verdict_change(row)
        # Each engine against the one it ran beside on one machine (PAIRS), interval by interval: unlike the change
        # against canary off, an engine of another machine that changed speed during its life moves none of it.
        row["pairs"] = {f"{way}/{other}": round(100 * paired_change([m for _, m in intervals[way][shape]],
                                                                    [m for _, m in intervals[other][shape]]), 3)
                        for way, other in PAIRS if way in intervals and other in intervals}
        rows.append(row)
    return rows


def paired_change(ms: list[float], base_ms: list[float]) -> float:
    """The median change of ``ms`` over ``base_ms``, interval by interval (the same steps in both)."""
    return statistics.median((m - b) / b for m, b in zip(ms, base_ms))


# (way, the way it is compared with on one machine): ours and canary off (cost-a), ours again and canary off again
# (cost-b), and ours again against the instrumented copy with the canary off (cost-c, run on cost-b's machine).
PAIRS = (("ours", "off"), ("ours-again", "off-again"), ("ours-again", "ours-none"))


def verdict_change(row: dict) -> float | None:
    """Ours's change the bar is judged on, in %: with a second engine of each, the faster of the two ours
    against the faster of the two offs (an engine can land in a slower mode for its whole life,
    canary or not: two canary-off engines have differed by a quarter at a shape), else ours against off."""
    if "ours" not in row:
        return None
    ours = min(row[w]["vs_off_pct"] for w in ("ours", "ours-again") if w in row)
    off = min(0.0, row["off-again"]["vs_off_pct"]) if "off-again" in row and "ours-again" in row else 0.0
    return round(((100 + ours) / (100 + off) - 1) * 100, 3)


# Cost sections (results.json's keys): the suites whose engines compare, the model's name on the page, and issue
# 38's bar for ours (added per decode step, every shape). In turns: every way's engine alive at once, one working at
# a time (gpu.sh cost-turns). One after another: canary off and ours; sglang's own, off again and ours again; the
# instrumented copy with the canary off (cost-a, cost-b, cost-c).
COST_MODELS = {
    "llama3-8b-turns": (("cost-turns",), "Llama-3-8B, 32 layers, bf16, engines in turns", 0.25),
    "llama3.2-1b-turns": (("cost-1b-turns",), "Llama-3.2-1B, 16 layers, bf16, engines in turns", 0.5),
    "llama3-8b": (("cost-a", "cost-b", "cost-c"), "Llama-3-8B, 32 layers, bf16, engines one after another", 0.25),
    "llama3.2-1b": (("cost-1b-a", "cost-1b-b", "cost-1b-c"),
                    "Llama-3.2-1B, 16 layers, bf16, engines one after another", 0.5),
}


def device_of(suites: dict, suite: str, device: str) -> str:
    """The machine a suite ran on: its archive's device.txt, else ``device`` (the folder's)."""
    return suites.get(suite, {}).get(DEVICE, device)


def other_machine(suites: dict, first: str, others: tuple, device: str) -> str:
    """The sentences naming the later cost suites left out because they ran on another machine, or ""."""
    return "".join(
        f" The `{suite}` archive ran on another machine ({device_of(suites, suite, device).split(',')[0]}) and is left "
        "out: ways compare only on one machine." for suite in others
        if suite in suites and device_of(suites, suite, device) != device_of(suites, first, device))


def turns_sentence(meta: dict) -> str:
    """How a cost suite in turns ran (its canary-off run's JSON), or "" for engines one after another."""
    if not meta.get("turn"):
        return ""
    return (f"The engines were alive at once on the GPU and worked in turns (`serve.py --turns`): each rep of a "
            f"shape (a {meta['short']}- and a {meta['long']}-token run) ran on every engine before any ran its next, "
            f"{meta['reps']} reps, so a change of the machine during the call fell on every engine alike (a slow "
            f"stretch of one engine's own did not). Each "
            f"engine's pool was capped at {meta['pool_tokens']:,} tokens so that all fit. ")


def cost_markdown(model: str, suites: dict, cost: list[dict], device: str) -> list[str]:
    (first, *others), title, bar = COST_MODELS[model]
    ways = [w for w in WAYS if w in cost[0]]
    meta = (suites.get(first, {}).get("off", {}).get("json") or {})
    out = ["", f"## Cost per decode step ({title})", "",
           f"Machine: {device_of(suites, first, device)}. "
           + commands(suites, (first, *others), device), "",
           turns_sentence(meta)
           + "Each cell: ms per decode step (tokens/s) and, in brackets, the median change against canary "
           "off over the same 40-step intervals (per interval, then the median). Canary off's step is its "
           "steady state (the median of the lower half of its intervals; the others straddle two runs), "
           "every other way's is that step times its change."
           + (" *canary off, again* is a second engine of the unmodified release: its distance from *canary off* is "
              "the noise of the measurement (*ours, again* likewise for ours)." if "off-again" in ways else "")
           + (" *ours' copy, canary off* is the instrumented copy serving with `--kv-canary none`: its distance from "
              "*canary off* is what the instrumented code does to the step without the canary's work, such as a "
              "different memory layout of the captured graphs." if "ours-none" in ways else "")
           + f" The bar for ours: at most {bar} % per decode step, judged"
           + (" on the faster of the two ours against the faster of the two canary-off engines (an engine can land"
              " in a slower mode for its whole life, canary or not)" if "ours-again" in ways and "off-again" in ways
              else " on ours against canary off")
           + "."
           + (" A cell where ours' copy with the canary off, served in the same call, moved by more than the bar is "
              "*not resolved*: there two engines without the canary's work differ by more than the bar measures."
              if "ours-none" in ways and not others else "")
           + other_machine(suites, first, tuple(others), device), "",
           "| batch x context | " + " | ".join(WAYS[w] for w in ways) + " | ours against the bar |",
           "|---|" + "---|" * len(ways) + "---|"]
    for r in cost:
        cells = []
        for way in ways:
            c = r[way]
            delta = "" if way == "off" else f" [{c['vs_off_pct']:+.2f} %, {c['vs_off_us']:+.0f} us]"
            cells.append(f"{c['step_ms']:.3f} ms ({c['tokens_per_s']:.0f}/s){delta}")
        change = r.get("verdict_pct")
        # In one call, the instrumented copy with the canary off is the control: beyond the bar, nothing is resolved.
        control = r["ours-none"]["vs_off_pct"] if "ours-none" in r and not others else None
        if change is None:
            verdict = "-"
        elif control is not None and abs(control) > bar:
            verdict = f"not resolved ({change:+.2f} %; ours' copy, canary off {control:+.2f} %)"
        else:
            verdict = f"{'within' if change <= bar else '**over**'} ({change:+.2f} %)"
        out.append(f"| {r['batch']} x {r['context']} | " + " | ".join(cells) + f" | {verdict} |")
    # The pairs of one call, where the section's engines ran in several (in turns, every change is of one call).
    pairs = [p for p in (f"{w}/{b}" for w, b in PAIRS) if all(p in r.get("pairs", {}) for r in cost)]
    if pairs and others:
        out += ["", "Each pair of one machine alone: the median change of the first over the second across the same "
                "40-step intervals (an engine of another machine that changed speed during its life moves none of "
                "these):", "",
                "| batch x context | " + " | ".join(
                    f"{WAYS[p.split('/')[0]]} against {WAYS[p.split('/')[1]]}" for p in pairs) + " |",
                "|---|" + "---|" * len(pairs)]
        out += [f"| {r['batch']} x {r['context']} | " + " | ".join(f"{r['pairs'][p]:+.2f} %" for p in pairs) + " |"
                for r in cost]
    short, long_, reps = meta.get("short", 16), meta.get("long", 208), meta.get("reps", 4)
    out += ["", f"The same runs by the difference method (wall time of a {long_}-token run minus a {short}-token run "
            f"over the same cached prompts, / {long_ - short}; median of {reps}), ms per step:", "",
            "| batch x context | " + " | ".join(WAYS[w] for w in ways) + " |", "|---|" + "---|" * len(ways)]
    for r in cost:
        out.append(f"| {r['batch']} x {r['context']} | "
                   + " | ".join(f"{r[w]['difference_method_ms']:.3f}" for w in ways) + " |")
    return out


def markdown(suites: dict, correctness: list[dict], cost: dict, device: str) -> str:
    devices = {runs.get(DEVICE, device) for runs in suites.values()}
    out = ["<!-- generated by bench/sglang_server/report.py from the archives in this folder; do not edit -->",
           "# Real sglang with the canary: results", "",
           f"Machines: {'; '.join(sorted(devices))}. Each table names the machine of its runs. Release: sglang "
           f"{first_meta(suites).get('sglang')} (unmodified for canary off and sglang's own canary; for ours a copy "
           "instrumented by the tool: on the H200 runs `scaffold` then `apply` (`instrument.py`, with the sites "
           "scaffold adds on paths sglang's own wiring leaves bare), on the earlier H100 runs `apply` alone), random "
           "weights (`--load-format dummy`), CUDA graphs on, radix cache on, chunked prefill on."
           + ("".join(f" Suites and runs named `{r}-...` ran sglang {r} instead."
                      for r in sorted({m.group(1) for m in map(OTHER_RELEASE.match, suites) if m}))),
           "", "## Correctness (ours, `--kv-canary log --kv-canary-real-data partial`)", "",
           commands(suites, {OTHER_RELEASE.sub("", r["suite"]) for r in correctness}, device)
           + " The self-test perturbations below come from the same calls; each row's machine is its own.", "",
           "| suite | run | machine | model | attention | prefill graph | target forwards | decode steps | requests | "
           "tokens generated | prefix tokens reused | `installed` lines | stats lines | violations |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in correctness:
        model = (r["model"] or "?") + (f" + {r['draft']}" if r["draft"] else "")
        status = "" if r["ok"] else f" (failed: {r['error']})"
        out.append(f"| {r['suite']} | {r['run']}{status} | {r['device']} | {model} | {r['attention']} | {r['prefill_graph']} | "
                   f"{r['forwards']} | {r['decode_steps']} | {r['requests']} | {r['generated_tokens']} | "
                   f"{r['cached_tokens']} | {r['installed_lines']} | {r['stats_lines']} | {r['violation_lines']} |")
    out += ["", "## Self-test perturbations (every kind armed at rate 0.02, sweep every 16 steps)", "",
            "Delays are in target steps (a draft's reports carry its target's step).", "",
            "A `real_kv_unused_cache` flip whose cache entry was evicted before any request held it is *evicted "
            "unread* (runs since the runtime logs it: a `kv_canary_perturb_left_cache=` line; earlier runs count it "
            "as missed); the share reported is over the other injections, the readable ones.", "",
            f"| run | machine | kind | {SCORE_HEADER[0]}", f"|---|---|---|{SCORE_HEADER[1]}"]
    for r in correctness:
        if "score" in r:
            out += score_rows(r["score"], f"{r['run']} | {r['device']} | ")
    out += tail_notes(correctness)
    out += ranks_markdown(suites)
    for model in COST_MODELS:
        if cost.get(model):
            out += cost_markdown(model, suites, cost[model], device)
    out += stall_markdown(suites)
    out += http_markdown(suites)
    for suite in PROFILE_MODELS:
        out += profile_markdown(suites, suite)
    out += bugs_markdown(suites)
    return "\n".join(out) + "\n"


# sglang's log prefix names a process's rank when there are several ("[... TP1]"); the lowest rank's combined line
# (docs/runtime.md, section 8).
RANK = re.compile(r"^\[[^\]]* TP(\d+)\] kv_canary violation:", re.M)
RANKS_LINE = re.compile(r"kv_canary ranks: step=(\d+) ranks=(\d+) violations=(\d+) written=(\d+) unhealthy_ranks=(\S+)")


def ranks_markdown(suites: dict) -> list[str]:
    """Tensor-parallel runs (``tp2``): the violations each rank logged for its own shard, and the lowest rank's last
    line for all ranks."""
    runs = sorted((name, run) for name, run in suites.get("tp2", {}).items() if name != DEVICE)
    if not runs:
        return []
    out = ["", "## Tensor parallel: every rank's canary (`tp2`)", "",
           f"Machine: {suites['tp2'].get(DEVICE, '?')}, `tp_size=2`: one scheduler process, KV shard and canary "
           "manager per GPU. Violations per rank: the `kv_canary violation` lines each rank logged; the combined "
           "line: the last `kv_canary ranks:` line of the lowest rank, which every rank's counts reach through an "
           "all-gather every 16 steps. " + commands(suites, ("tp2",)), "",
           "| run | violations logged, rank 0 / rank 1 | combined line: step | ranks | violations | rows written | "
           "unhealthy ranks |", "|---|---|---|---|---|---|---|"]
    for name, run in runs:
        per_rank = [0, 0]
        for rank in RANK.findall(run["log"]):
            if int(rank) < len(per_rank):
                per_rank[int(rank)] += 1
        last = RANKS_LINE.findall(run["log"])
        step, ranks, violations, written, unhealthy = last[-1] if last else ("-",) * 5
        out.append(f"| {name} | {per_rank[0]:,} / {per_rank[1]:,} | {step} | {ranks} | {violations} | {written} | "
                   f"{unhealthy} |")
    return out


def decode_steps_ms(lines: list[tuple]) -> list[float]:
    """The decode step time (ms) each of sglang's ``Decode batch`` lines (``DECODE`` matches) implies: its batch
    over its generation throughput."""
    return [int(r) / float(t) * 1e3 for r, _, t in lines if float(t) > 0]


def stall_markdown(suites: dict) -> list[str]:
    """Each batch bucket first met in an eager decode (serve.py stall): the waves' wall times per way, and the
    largest decode step of each run from the scheduler's per-step lines (a wave's first line spans the gap
    since the last wave and its prefill, so it is left out)."""
    runs = {name.removeprefix("stall-"): run for name, run in suites.get("stall", {}).items()
            if name != DEVICE and run["json"]}
    if not runs:
        return []
    ways = [w for w in ("off", "ours", "ours-cached") if w in runs]
    labels = {"off": "canary off, empty Triton cache", "ours": "ours, empty Triton cache",
              "ours-cached": "ours, its Triton cache kept"}
    out = ["", "## First use of each batch bucket (no compile stall)", "",
           f"Machine: {suites['stall'].get(DEVICE, '?')}. `serve.py stall`: MHA (Llama-3-8B heads, 4 layers), decode "
           "CUDA graph for batch 1 only, so every larger decode is eager; waves of 1 to 256 requests (each power of "
           "two a plan width takes, and one past it), 32 tokens each, `decode_log_interval=1`. Each engine starts "
           "with an empty Triton cache but the last, which keeps ours's. " + commands(suites, ("stall",)), "",
           "| wave (requests) | " + " | ".join(labels[w] + ", wave s" for w in ways) + " |",
           "|---|" + "---|" * len(ways)]
    waves = {w: {x["batch"]: x["wave_s"] for x in runs[w]["json"]["waves"]} for w in ways}
    for batch in waves[ways[0]]:
        out.append(f"| {batch} | " + " | ".join(str(waves[w].get(batch, "-")) for w in ways) + " |")
    largest = []
    for w in ways:
        steps = []
        for block in re.findall(r"stall: begin batch \d+\n(.*?)stall: end batch", runs[w]["log"], re.S):
            steps += decode_steps_ms(DECODE.findall(block)[1:])
        largest.append(f"{max(steps):.2f} ms" if steps else "-")
    out += ["| engine start (s) | " + " | ".join(str(runs[w]["json"]["engine_start_s"]) for w in ways) + " |",
            "| largest decode step | " + " | ".join(largest) + " |"]
    return out


HTTP_WAYS = {"http-off": "canary off", "http-ours": "ours", "http-upstream": "sglang's own"}


def http_markdown(suites: dict) -> list[str]:
    """The HTTP server under sglang's bench_serving (serve_http.py): the three ways at each rate, what each
    server's canary logged, and the perturbation run through the same server (``deploy`` suite)."""
    runs = {name: run for suite in ("http", "deploy") for name, run in suites.get(suite, {}).items()
            if name.startswith("http-") and run["json"]}
    labels = dict(HTTP_WAYS)
    for suite, other in ((s, OTHER_RELEASE.match(s)) for s in sorted(suites)):
        if other and OTHER_RELEASE.sub("", suite) == "http":  # another release's servers: rows of their own
            for name, run in suites[suite].items():
                if name in HTTP_WAYS and run["json"]:
                    runs[f"{other.group(1)}-{name}"] = run
                    labels[f"{other.group(1)}-{name}"] = f"{HTTP_WAYS[name]}, sglang {other.group(1)}"
    ways = [w for w in labels if w in runs]
    if not runs:
        return []
    meta = runs[(ways or list(runs))[0]]["json"]
    out = ["", "## The HTTP server under sglang's `bench_serving`", "",
           f"Machine: {suites.get('http', suites.get('deploy', {})).get(DEVICE, '?')}. `serve_http.py`: "
           "`python -m sglang.launch_server` (Llama-3-8B, 32 layers, random weights, Triton attention, "
           f"`--max-running-requests {_argument(meta, '--max-running', '64')}`, sglang's defaults otherwise: decode "
           "and prefill CUDA graphs, radix cache, chunked prefill, overlap scheduling), one server at a time; "
           "`python -m sglang.bench_serving --backend sglang --dataset-name random-ids` with "
           f"{_argument(meta, '--num-prompts', '96')} prompts of {_argument(meta, '--input-len', '1024')} tokens and "
           f"{_argument(meta, '--output-len', '128')} output tokens (each drawn from half to all of that), a seed per "
           "rate (the same prompts in every way), after a warm-up run of 16 prompts. TTFT and ITL in ms. "
           + commands(suites, ("http", "deploy")), ""]
    if ways:
        out += ["| rate (req/s) | way | req/s | output tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |",
                "|---|---|---|---|---|---|---|---|"]
        rates = [r["rate"] for r in runs[ways[0]]["json"]["rates"]]
        for rate in rates:
            for way in ways:
                row = next((r for r in runs[way]["json"]["rates"] if r["rate"] == rate), None)
                if row is None:
                    out.append(f"| {rate} | {labels[way]} | - | - | - | - | - | - |")
                    continue
                out.append(f"| {rate} | {labels[way]} | {row['request_throughput']:.2f} | "
                           f"{row['output_throughput']:.0f} | {row['median_ttft_ms']:.1f} | {row['p99_ttft_ms']:.1f} | "
                           f"{row['median_itl_ms']:.2f} | {row['p99_itl_ms']:.2f} |")
    out += ["", "| server | served | start (s) | requests completed | `installed` lines | stats lines | violations |",
            "|---|---|---|---|---|---|---|"]
    for name, run in sorted(runs.items()):
        meta, log = run["json"], run["log"]
        status = "yes" if meta.get("ok") else f"no: {meta.get('error')}"
        completed = sum(r.get("completed") or 0 for r in meta.get("rates", []))
        out.append(f"| {name} | {status} | {meta.get('server_start_s', '-')} | {completed} | "
                   f"{log.count('kv canary installed:')} | {len(StatsLine.find_all(log))} | "
                   f"{log.count('kv_canary violation:')} |")
    perturbed = runs.get("http-ours-perturb")
    if perturbed and not perturbed["json"].get("rates"):
        out += ["", f"The HTTP server with every perturbation armed (`deploy`) did not serve: {perturbed['json'].get('error')}."]
    elif perturbed:
        out += ["", f"The HTTP server with every perturbation armed at {perturbed['json']['perturb']} (ours, sweep every "
                f"16 steps, rates {', '.join(r['rate'] for r in perturbed['json']['rates'])}, sharing the GPU "
                "with the `deploy` suite's other engines):", "",
                f"| kind | {SCORE_HEADER[0]}", f"|---|{SCORE_HEADER[1]}"]
        out += score_rows(perturb_score(perturbed["log"]), "")
    return out


# profile suite -> the model it profiles (gpu.sh) and its layers
PROFILE_MODELS = {"profile": ("Llama-3-8B", 32), "profile-1b": ("Llama-3.2-1B", 16)}


def profile_batches(runs: dict) -> str:
    """``PROFILE_BATCHES=...`` as gpu.sh was given it for the profiled ways ``runs`` (way-BxC, or way for batch 1),
    or "" for its default (1 and 8)."""
    batches = " ".join(map(str, sorted({int(way.partition("-")[2].partition("x")[0] or 1) for way in runs})))
    if batches == "1 8":
        return ""
    return f'PROFILE_BATCHES="{batches}" ' if " " in batches else f"PROFILE_BATCHES={batches} "


def profile_markdown(suites: dict, suite: str) -> list[str]:
    """A per-step profile suite (profile_step.py, ``profile`` or ``profile-1b``): each way's trace summary, median per
    decode step."""
    runs = {name.removeprefix("profile-").removesuffix(".summary"): run["json"]
            for name, run in suites.get(suite, {}).items() if name.endswith(".summary") and run["json"]}
    if not runs:
        return []
    model, layers = PROFILE_MODELS[suite]
    title = "" if suite == "profile" else f", {model}"  # the 8B's section keeps the title it has always had
    out = ["", f"## Where a decode step's time goes (sglang's profiler, `profile_step.py`{title})", "",
           f"Machine: {suites[suite].get(DEVICE, '?')}. {model} ({layers} layers), batch 1 x 1024 context unless the "
           "way names another (batch x context), decode graph replayed, 64 profiled steps; medians per step. "
           "Host: the outermost `canary_instrument` Python "
           "frames on the thread that replays the graph, less the engine code they call (the sampler inside the "
           "canary's sample wrapper); calls: CUDA runtime calls (and host reads of device values) made by the "
           "canary's code; kernels: the device time of the canary's own kernels and of what its code launched; "
           "device busy: all device work per step, summed (work beside other work counts twice); graph: the "
           "replayed graph on the device, its first kernel's start to its last kernel's end (the forward's device "
           "time with the canary's passes inside it, which the host's speed does not reach; archives from before it "
           f"was read show -). Command: `{profile_batches(runs)}{GPU_SH} {suite}`.", "",
           "| way | step (us) | canary host (us) | canary kernels (us) | device busy (us) | graph (us) | "
           "syncs per step | calls inside canary frames |",
           "|---|---|---|---|---|---|---|---|"]
    earlier = False
    for way, summary in sorted(runs.items()):
        for s in summary.values():
            calls = ", ".join(f"{n} {c['per_step']:g}/step ({c['total']} in all)"
                              for n, c in s["calls_in_canary_frames"].items()) or "-"
            busy = s.get("device_busy_us")
            mark = busy is None and s["canary_host_us"] > 0
            earlier |= mark
            host = f"{s['canary_host_us']:.1f}{'*' if mark else ''}" if s.get("stacks", True) else "- (no stacks)"
            graph = s.get("graph_us")
            out.append(f"| {way} | {s['step_us']:.1f} | {host} | "
                       f"{s['canary_device_us']:.1f} | {'-' if busy is None else f'{busy:.1f}'} | "
                       f"{'-' if graph is None else f'{graph:.1f}'} | {s['syncs_per_step']:g} | {calls} |")
    per_kernel = [(way, name, k) for way, summary in sorted(runs.items()) for s in summary.values()
                  for name, k in s.get("canary_kernels_per_step", {}).items()]
    if per_kernel:
        out += ["", "The canary's kernels, per decode step (mean):", "", "| way | kernel | launches | device us |",
                "|---|---|---|---|"]
        out += [f"| {way} | {name} | {k['launches']:g} | {k['us']:.1f} |" for way, name, k in per_kernel]
    out += kernel_changes(runs)
    if earlier:
        out += ["", "\\* A summary made before the analysis set the engine's code apart: its host time and calls include "
                "the engine's sampler, which runs inside the canary's sample wrapper, and it has no device-busy "
                "figure (the traces stay on the machine)."]
    return out


def kernel_changes(runs: dict, top: int = 12) -> list[str]:
    """For each shape profiled both ways: the kernels whose time per step differs most between canary off and
    ours (the engine's kernels too: which of them the canary slowed, or which ran in its place)."""
    rows = []
    for way, summary in sorted(runs.items()):
        if not way.startswith("none"):
            continue
        ours = runs.get("log" + way.removeprefix("none"))
        if ours is None:
            continue
        off = next(iter(summary.values())).get("kernels_per_step")
        on = next(iter(ours.values())).get("kernels_per_step")
        if not off or not on:
            continue
        shape = way.removeprefix("none").removeprefix("-") or "1x1024"
        zero = {"launches": 0, "us": 0.0}
        diffs = sorted(((on.get(n, zero)["us"] - off.get(n, zero)["us"], n) for n in {*off, *on}),
                       key=lambda d: -abs(d[0]))[:top]
        for diff, name in diffs:
            short = name if len(name) <= 90 else name[:87] + "..."
            rows.append(f"| {shape} | `{short.replace('|', '/')}` | {off.get(name, zero)['us']:.1f} | "
                        f"{on.get(name, zero)['us']:.1f} | {diff:+.1f} |")
    if not rows:
        return []
    return ["", "The kernels whose time per decode step differs most between canary off and ours (mean; each way's "
            "longest kernels, `TOP_KERNELS` in profile_step.py; a kernel outside one way's list counts 0 there):", "",
            "| shape | kernel | canary off (us) | ours (us) | change (us) |", "|---|---|---|---|---|", *rows]


def first_meta(suites: dict) -> dict:
    for suite, runs in suites.items():
        if OTHER_RELEASE.match(suite):
            continue
        for name, run in runs.items():
            if name != DEVICE and run["json"]:
                return run["json"]
    return {}


EXCEPTION = re.compile(r"^(?:\[[^\]]*\] )?([\w.]*(?:Error|Exception)): (.*)$", re.M)


def raised(log: str) -> str | None:
    """What the scheduler raised, in one line: the exception after sglang's 'Scheduler hit an exception'."""
    at = log.find("Scheduler hit an exception")
    found = EXCEPTION.search(log, at) if at >= 0 else None
    if found is None:
        return None
    name, message = found.group(1).rpartition(".")[2], found.group(2)
    return f"{name}: {message[:90]}"


def bug_cell(run: dict, ours: bool) -> str:
    """One way's outcome under one bug: what its canary reported, what sglang raised, a hang."""
    log, watch = run["log"], run["watch"] or {}
    parts = []
    lines = log.count("kv_canary violation:")
    if ours and lines:
        first = Violation.find_all(log)[0]
        parts.append(f"detected at step {first.step} ({'+'.join(sorted(first.reasons))}), {lines} full lines, "
                     f"{len(SummaryLine.find_all(log))} summaries")
    elif lines:
        parts.append(f"{lines} violation lines")
    error = raised(log)
    if error and "failed to listen" in error:
        return f"not run: the engine did not start ({error})"
    if error:
        parts.append(f"sglang raised `{error}`")
    if watch.get("killed_at_limit"):
        parts.append(f"**hung**, killed at {watch['limit_s']:.0f} s (stacks in its log)")
    elif watch:
        parts.append(f"exited {watch['exit']} after {watch['elapsed_s']:.0f} s" if error else "served to the end")
    elif (run.get("json") or {}).get("error"):  # no watcher's record: the call's time ran out around the run
        parts.append("**still running** when its call's time ran out (killed with it)")
    return "; ".join(parts) or "served to the end, nothing reported"


def bugs_markdown(suites: dict) -> list[str]:
    corpus = {name: run for suite in ("corpus1", "corpus2", "corpus3", "corpus4") for name, run in suites.get(suite, {}).items()
              if name != DEVICE and "." in name}
    flood = {name: run for name, run in suites.get("flood", {}).items() if name != DEVICE}
    if not corpus and not flood and "attrib" not in suites:
        return []
    device = suites.get("flood", suites.get("corpus1", {})).get(DEVICE, "?")
    out = ["", "## The canary under real bugs in sglang's KV bookkeeping", "",
           f"Device: {device}. Each bug is one edit of sglang 0.5.17's own source (`bench/sglang_server/bugs.py`, "
           "applied to the instrumented copy for ours and to the unmodified release for sglang's own canary and "
           "canary off); every run is watched (`watch.py`: a run still going at its limit has its stacks dumped, "
           "then is killed). MHA (Llama-3-8B heads, 4 layers), `--kv-canary log` unless said. "
           + commands(suites, ("flood", "attrib", "corpus1", "corpus2", "corpus3", "corpus4"), device)]
    if flood:
        out += ["", "### A flood: every decode step corrupts what every request reads (`decode_table_shift`)", "",
                "3000 planned decode steps each, the same workload; *warm-up* is the first engine on the machine "
                "(Triton compiles the canary's kernels for each batch bucket it meets). Then a clean and a flood "
                "engine, twice (`gpu.sh flood` starts each pair at once; archives made before that ran them one "
                "at a time, README.md says which).", "",
                "| run | serving time (s) | median decode step (ms) | violations (device total) | logged in full | "
                "summary lines |", "|---|---|---|---|---|---|"]
        serve, step = {}, {}
        for name in ("flood-warmup", "flood-clean", "flood-bug", "flood-clean-again", "flood-bug-again"):
            run = flood.get(name)
            if run is None or not run["json"]:
                continue
            stats = StatsLine.find_all(run["log"])
            total = stats[-1].violations if stats else 0
            steps = decode_steps_ms(DECODE.findall(run["log"]))
            serve[name] = run["json"].get("serve_s")
            if steps:
                step[name] = statistics.median(steps)
            median = f"{step[name]:.3f}" if name in step else "-"
            out.append(f"| {name} | {serve[name]} | {median} | {total} | "
                       f"{run['log'].count('kv_canary violation:')} | {len(SummaryLine.find_all(run['log']))} |")
        clean = [n for n in ("flood-clean", "flood-clean-again") if n in step]
        bug = [n for n in ("flood-bug", "flood-bug-again") if n in step]
        if clean and bug:
            # Clean and flood engines alternate, so a drift of the machine's speed during the suite falls on both.
            on_clean = statistics.mean(step[n] for n in clean)
            on_bug = statistics.mean(step[n] for n in bug)
            spread = max(step[n] for n in clean) / min(step[n] for n in clean) - 1
            out += ["", f"Median decode step under the flood: {100 * (on_bug / on_clean - 1):+.1f} % against the clean "
                    f"runs (the means of {len(bug)} flood and {len(clean)} clean engines; the clean engines differ "
                    f"from each other by {100 * spread:.0f} %). Serving time: {', '.join(f'{n} {serve[n]} s' for n in clean + bug)}."]
        run = flood.get("raise-bug")
        error = re.search(r"CanaryViolationError: (.*)\n(.*)", run["log"]) if run is not None else None
        if error:
            watch = run["watch"] or {}
            out += ["", f"The same bug with `--kv-canary raise`: the scheduler raised `CanaryViolationError: "
                    f"{error.group(1)}` at the end of the step that read the first violation, its first line "
                    f"`{error.group(2)[:170]}`, and the engine's process exited ({watch.get('exit')}) "
                    f"{watch.get('elapsed_s')} s after it was started, engine start included."]
    probe = {name: run for name, run in suites.get("attrib", {}).items() if name != DEVICE and "." in name}
    if probe:
        ways = [probe.get(f"hang.{way}") for way in ("ours", "upstream", "off")]
        out += ["", "### The hang probe: `radix_match_short` with the idle-cache sweep on (`attrib` suite)", "",
                "1000 planned decode steps, the three engines at once, ours and sglang's own with "
                "`--kv-canary-sweep-interval 16`.", "",
                "| bug | ours | sglang's own canary | canary off (sglang alone) |", "|---|---|---|---|",
                "| `radix_match_short` | " + " | ".join(bug_cell(run, i == 0) if run else "not run"
                                                      for i, run in enumerate(ways)) + " |"]
    if corpus:
        out += ["", "### The corpus: ours, sglang's own canary, and sglang alone", "",
                "Every bug's three engines at once: `corpus1` and `corpus2` on MHA, 1500 planned decode steps; `corpus3` "
                "on the layout or feature each bug needs (SWA on gpt-oss, EAGLE, MHA with HiCache), 1000; `corpus4` the "
                "radix cache's eviction and insert bugs on MHA with a 4096-token pool: the eviction bug under `serve.py "
                "evict` (a running request's locked prompt node under a cache filled to 1920 free slots, then a prefill "
                "that must evict), the insert bug under the correctness workload (the cache evicts in every wave), "
                "1500. A bug served by two suites shows the later one's runs.", "",
                "| bug | what it breaks | ours | sglang's own canary | canary off (sglang alone) |", "|---|---|---|---|---|"]
        for bug, what in BUG_NAMES.items():
            ways = [corpus.get(f"{bug}.{way}") for way in ("ours", "upstream", "off")]
            if not any(ways):
                continue
            cells = [bug_cell(run, way == 0) if run else "not run" for way, run in enumerate(ways)]
            out.append(f"| `{bug}` | {what} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    suites = read_runs(args.folder)
    # The device of the archives that carry none (those made before the gate suite): the folder's device.txt.
    device = machine((args.folder / "device.txt").read_text()) if (args.folder / "device.txt").exists() else "?"
    correctness = []
    for suite in sorted(suites):
        other = OTHER_RELEASE.match(suite)
        for name, run in sorted(suites[suite].items()):
            # Names with a dot are bug runs (BUG.WAY), reported with the corpus.
            wanted = OTHER_RELEASE.sub("", suite) in CORRECTNESS_SUITES or name.startswith(("fi-", "mtp-", "tp2-"))
            if name != DEVICE and "." not in name and (run["json"] or run["log"]) and wanted:
                # A run without its JSON is one whose process was killed (sglang's own teardown kills the
                # parent when the scheduler fails at start): its row says what was raised.
                row = correctness_row(name, run)
                if not run["json"]:
                    row["error"] = raised(run["log"]) or "killed before it wrote its result"
                row["device"] = suites[suite].get(DEVICE, device).split(",")[0]
                row["suite"] = suite
                if other:  # the release in the run's name too: the perturbation table has no suite column
                    row["run"] = f"{other.group(1)}-{name}"
                correctness.append(row)
    cost = {}
    for model, (pair, _, _) in COST_MODELS.items():
        # Ways compare only on one machine: the second suite joins the first only when their devices agree.
        same = [s for s in pair if device_of(suites, s, device) == device_of(suites, pair[0], device)]
        runs = {name: run for suite in same for name, run in suites.get(suite, {}).items()}
        cost[model] = cost_table(runs) if "off" in runs else []
    (args.folder / "results.json").write_text(json.dumps({"device": device, "correctness": correctness,
                                                          "cost": cost}, indent=1) + "\n")
    (args.folder / "RESULTS.md").write_text(markdown(suites, correctness, cost, device))
    print(f"wrote {args.folder / 'RESULTS.md'} and results.json")


if __name__ == "__main__":
    main()
