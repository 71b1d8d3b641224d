"""Write RESULTS.md from the committed runs in results/: one current table per benchmark, each from the
newest run that measured it, with that run's machine and command (every figure is measured).

    python bench/kernels/write_results.py > bench/kernels/RESULTS.md

A new GPU run of bench_kernels.py (or plan_width.py) goes into results/ under a name saying the machine
and what ran, last in RUNS (or as PLAN_WIDTH); a run every table of which a newer one replaced leaves
the folder (git keeps it). tests/bench/test_kernels_results.py checks the page against this script.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench_kernels.py's results.json of each committed run, oldest first: a later run's table replaces an
# earlier one's (the scaling table per real-KV mode).
RUNS = ("h200_beside.json", "h200_small_batch.json", "h200.json", "h100.json", "h100_verify_scaling.json", "h100_scaling_partial_32_layers.json")
PLAN_WIDTH = "h100_plan_width.json"  # plan_width.py's run
SECTIONS = {"tuning": "tuning", "verify": "verify bandwidth", "write_16k": "16k write",
            "vs_reference": "torch reference", "sweep": "sweep", "small": "small batches",
            "beside": "passes beside a forward"}
COMMAND = "python bench/kernels/write_results.py > bench/kernels/RESULTS.md"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def newest(runs, section):
    """(name, run) of the newest run holding ``section``, or None."""
    found = [(name, r) for name, r in runs if section in r]
    return found[-1] if found else None


def describe_run(name: str, r: dict, tables: list[str]) -> str:
    parts = [f"`results/{name}` ({'; '.join(tables)}): {r['device']}"]
    if "torch" in r:
        parts.append(f"torch {r['torch']}, triton {r['triton']}")
    if "copy_tb_s" in r:
        parts.append(f"device-to-device copy {r['copy_tb_s']:.2f} TB/s")
    if "layers" in r:
        parts.append(f"{r['layers']} layers per fingerprinted half ({r['layer_buffers']} distinct buffers), "
                     f"request-side checks {'on' if r['request_side'] else 'off'}")
    elif name in RUNS:
        parts.append("one layer per fingerprinted half (the run predates `--layers`)")
    if isinstance(r.get("config"), str):  # --config; a tuned run's "config" is what the tuning chose
        parts.append(f"launch {r['config']} for every mode")
    if "incomplete" in r:
        parts.append("cut short (its `incomplete` field says where)")
    return ", ".join(parts) + f". Command: `{r['command']}`"


def source(name: str) -> str:
    return f"Run: `results/{name}`."


def render(runs: list[tuple[str, dict]], plan_width: tuple[str, dict] | None) -> str:
    lines = [
        "# Canary kernel benchmarks",
        "",
        f"Written by `{COMMAND}` from the committed runs in `results/`; do not edit by hand. One current "
        "table per benchmark, each from the newest run that measured it; earlier runs are in git history.",
        "",
        "Pass times (tuning, verify, scaling) are per pass inside one CUDA graph of 20 passes, each after a "
        "128 MiB L2 flush, minus a graph of the flushes alone (`per_pass_ms`): the runtime's passes are nodes of "
        "the model's graph, so they pay no graph launch of their own and find their data out of L2. Beside "
        "them, one replay of a graph holding a single pass (its launch included). Write and reference speedups "
        "use single replays. The reference bandwidth is a device-to-device copy of 2 GiB, bytes read + written, "
        "`triton.testing.do_bench` median, measured in the same run.",
        "",
        "## Runs",
        "",
        "Oldest first. A table from an older run measured the kernels of its day: no later run reached it.",
        "",
    ]
    tables = {name: [] for name, _ in runs}
    for section, title in SECTIONS.items():
        found = newest(runs, section)
        if found:
            tables[found[0]].append(title)
    modes = {}
    for name, r in runs:
        modes.update(dict.fromkeys((s["realkv"] for s in r.get("scaling", ())), name))
    for mode, name in modes.items():
        tables[name].append(f"scaling, realkv={mode}")
    unused = [name for name, t in tables.items() if not t]
    if unused:
        raise SystemExit(f"{', '.join(unused)}: every table of these runs has a newer run; take them out of RUNS")
    lines += [f"- {describe_run(name, r, tables[name])}" for name, r in runs]
    if plan_width:
        lines.append(f"- {describe_run(*plan_width, ['plan width'])}")
    lines.append("")

    found = newest(runs, "tuning")
    if found:
        name, r = found

        def launch(c):
            variant = f"variant {c['variant']}, " if "variant" in c else ""
            return f"{variant}BLOCK={c['block']}, num_warps={c['num_warps']}, {c['programs_per_sm']} programs/SM"

        lines += [
            "## Launch configurations (`bench_kernels.py`, tuning)",
            "",
            "Swept per real-KV mode. The verify-bandwidth table uses each mode's fastest 1M-position verify ("
            + "; ".join(f"{k}: {launch(v)}" for k, v in r["verify_config"].items())
            + "); the other tables of the run use the one with the lowest worst-case share of attention time "
            "over both ends of the scaling table ("
            + "; ".join(f"{k}: {launch(v)}" for k, v in r["config"].items())
            + "; realkv=all: the runtime default launch).",
            "",
            table(["realkv", "variant", "BLOCK", "num_warps", "programs/SM", "1M-position verify per pass (us)",
                   "8 x 16384 pre + post per pass (us)", "violations"],
                  [(t["realkv"], t.get("variant", "shipped"), t["block"], t["num_warps"], t["programs_per_sm"],
                    f"{t['us']:.1f}", f"{t['small_us']:.1f}", t["violations"]) for t in r["tuning"]]),
            "",
            source(name),
            "",
        ]
    found = newest(runs, "verify")
    if found:
        name, r = found
        lines += [
            "## Verify bandwidth (1,048,576 positions = 64 requests x 16384, MHA K and V halves)",
            "",
            "Bytes per verified position: req_to_token 4 B + per half the 32 B canary row (no per-position expected"
            " token: the sampled-token check reads one entry per request) (+ with realkv=partial the 32 B sector"
            " holding the 16 B of layer 0's KV row it fingerprints). Predecessor rows are the neighbouring lane's"
            " and are not counted. Bar: >= 60 % of the copy bandwidth for contiguous pages.",
            "",
            "A copy moving the same bytes, timed the same way, is beside it: copies of tens of megabytes do not"
            " reach the 2 GiB copy's bandwidth either.",
            "",
            table(["realkv", "pages", "bytes/position", "time per pass (us)", "one graph replay (us)", "TB/s",
                   "% of copy", "same-size copy, same timing (TB/s)", "violations", "bar"],
                  [(v["realkv"], v["pages"], v["bytes_per_position"], f"{v['us']:.1f}",
                    f"{v['replay_us']:.1f}" if "replay_us" in v else "-", f"{v['tb_s']:.2f}",
                    f"{100 * v['fraction_of_copy']:.0f} %",
                    f"{v['same_size_copy_tb_s']:.2f}" if "same_size_copy_tb_s" in v else "-", v["violations"],
                    verdict(v["fraction_of_copy"] >= 0.6) if v["pages"] == "contiguous" else "(reported)")
                   for v in r["verify"]]),
            "",
            source(name),
            "",
        ]
    found = newest(runs, "write_16k")
    if found:
        name, r = found
        lines += [
            "## 16k-token single-request write vs a serial per-request chain",
            "",
            "Baseline (`serial_chain_write` in bench_kernels.py): one Triton program per request walks its tokens"
            " one by one, as upstream's one-thread-per-request CUDA kernel does. Ours: the pre-forward pass"
            " (scan of affine maps in BLOCK-wide chunks; each chunk composes the maps of the chunks before it"
            " serially in one segment per lane joined by a scan (CATCH 0, shipped); CATCH N: N lanes at a time,"
            " measured, not shipped). Bar: >= 50x.",
            "",
            table(["tokens", "BLOCK", "CATCH", "parallel (us)", "serial (us)", "speedup", "rows identical", "bar"],
                  [(w["tokens"], w["block"], w.get("catch", 0), f"{w['parallel_us']:.1f}", f"{w['serial_us']:.1f}",
                    f"{w['speedup']:.0f}x", w["rows_identical"], verdict(w["speedup"] >= 50 and w["rows_identical"]))
                   for w in r["write_16k"]]),
            "",
            source(name),
            "",
        ]
    found = newest(runs, "vs_reference")
    if found:
        name, r = found
        lines += [
            "## Against the torch reference (64 x 4096 decode batch, realkv=partial)",
            "",
            "The reference runs eagerly on the same GPU (it reads the batch size on the host). Bar: >= 20x.",
            "",
            table(["layout", "kernel", "triton (us)", "torch (us)", "speedup", "bar"],
                  [(v["layout"], v["kernel"], f"{v['triton_us']:.1f}", f"{v['torch_us']:.0f}",
                    f"{v['speedup']:.0f}x", verdict(v["speedup"] >= 20)) for v in r["vs_reference"]]),
            "",
            source(name),
            "",
        ]
    by_mode = {}  # real-KV mode -> (run name, rows), the newest run's
    for name, r in runs:
        for mode in dict.fromkeys(s["realkv"] for s in r.get("scaling", ())):
            by_mode[mode] = name, [s for s in r["scaling"] if s["realkv"] == mode]
    if by_mode:
        lines += [
            "## Per-forward canary cost vs attention's KV read (Llama-3-8B decode)",
            "",
            "One CUDA graph holds the pre-forward pass (verify every prefix position in K and V, write the new"
            " token's rows) and the post-forward pass (verify the new rows, fingerprint them), with the"
            " expected-token table on. Attention time = requests x context x 128 KiB / copy bandwidth."
            " The req pool has the rows of a deployment (req-pool rows column: sglang's default"
            " max_running_requests of 2048-4096, plus its padding row), not just the batch's."
            " Each real-KV mode's rows come from the newest run that measured it (run column; the runs' layers"
            " and launch are listed above). Bar: <= 0.5 %.",
            "",
            table(["realkv", "requests x context", "req-pool rows", "canary per forward (us)",
                   "one graph replay (us)", "attention KV read (us)", "canary / attention", "violations", "bar",
                   "run"],
                  [(s["realkv"], f"{s['reqs']} x {s['ctx']}", s.get("pool_rows", s["reqs"] + 1),
                    f"{s['canary_us']:.1f}", f"{s['replay_us']:.1f}" if "replay_us" in s else "-",
                    f"{s['attention_us']:.0f}", f"{s['percent']:.3f} %", s["violations"], verdict(s["percent"] <= 0.5),
                    f"`{name}`")
                   for mode in ("none", "partial", "all") if mode in by_mode
                   for name, rows in [by_mode[mode]] for s in rows]),
            "",
        ]
    small = newest(runs, "small")
    if small:  # a bench_kernels.py --only small run: as served and bare
        name, r = small
        rows = [(f"{w['reqs']} x {w['ctx']}", "as served" if w["served"] else "bare", w["programs_per_sm"],
                 w["pre_us"], w["post_us"], w["both_us"], w["violations"]) for w in r["small"]]
        run = source(name)
    if small:
        lines += [
            "## Small decode batches: where each pass's time goes (realkv=partial)",
            "",
            "Each pass alone and both together, per pass as the scaling table times them (32 layers per half,"
            " request-side checks on, 4097-row req pool), at several grid sizes. *As served*: with what a server's"
            " passes also do, the freed-slot mark kernel before the pre pass and the status publish into pinned host"
            " memory at the end of the post pass (`bench_kernels.py --only small`); *bare*: neither. The work grows"
            " 8-fold from 1 x 1024 to 1 x 8192 and 64-fold to 64 x 1024.",
            "",
            table(["requests x context", "passes", "programs/SM", "pre (us)", "post (us)", "pre + post (us)",
                   "violations"],
                  [(*row[:3], *(f"{us:.1f}" for us in row[3:6]), row[6]) for row in rows]),
            "",
            run,
            "",
        ]
    found = newest(runs, "beside")
    if found:
        name, r = found
        logits = any(w["variant"] == "beside, post at the logits" for w in r["beside"])  # runs since the LM head
        forks = any(w["variant"] == "forks alone, no pass" for w in r["beside"])
        lines += [
            "## The passes beside a decode forward (`bench_kernels.py --only beside`)",
            "",
            "What the canary adds to one CUDA-graph replay of a stand-in Llama-3-8B decode forward (32 layers of"
            " bf16 projections and a grouped-query attention read of each request's context"
            + (", then the LM head's logits" if logits else "") + "; no model), realkv="
            "partial, served passes (freed-slot mark, status publish), request-side checks on: *in line*, the mark"
            " and pre pass before the forward and the post pass after it; *beside*, the mark and pre pass on a"
            " second stream beside the forward (the runtime's `Beside`) at the grid given, the post pass (16"
            " programs/SM) after the join"
            + ("; *beside, post at the logits*, as the runtime serves a model with a logits module: the post"
               " pass forked onto that stream too when the logits begin (both passes 16 programs/SM, or as the"
               " variant says)" if logits else "")
            + ("; *forks alone, no pass*, that placement's forks and join with a one-element store in place of"
               " each pass: what the graph's second branch costs the forward apart from the passes' work"
               if forks else "")
            + ". Each variant timed three times, interleaved; the median, and the spread of the three.",
            "",
            table(["requests x context", "variant", "replay (ms)", "added (us)", "added (%)", "spread (us)",
                   "violations"],
                  [(f"{w['reqs']} x {w['ctx']}", w["variant"], f"{w['ms']:.3f}",
                    "-" if w["variant"] == "forward" else f"{w['added_us']:+.1f}",
                    "-" if w["variant"] == "forward" else f"{w['added_pct']:+.2f}", f"{w['spread_us']:.1f}",
                    w["violations"]) for w in r["beside"]]),
            "",
            source(name),
            "",
        ]
    found = newest(runs, "sweep")
    if found:
        name, r = found
        sweeps = r["sweep"]
        lines += [
            "## Idle-cache sweep: cost of one sweep step",
            "",
            f"A prefix cache of 65,536 positions (64 paths of {sweeps[0]['edge']}-slot nodes with device-resident"
            " values, as sglang keeps them), rows written and fingerprinted; SWA window 256. Per sweep step:"
            " host = the walk of one slice plus its upload (one pinned copy, a device gather of the node"
            " values), measured on the host without waiting for the device; kernel = the sweep kernel alone"
            " (CUDA-graph replay); step = everything a sweep step does, as `Sweeper.maybe_sweep` runs it,"
            " wall time including the device. A sweep runs every `kv_canary_sweep_interval` steps, so its"
            " cost per serving step is the step time divided by the interval.",
            "",
            table(["layout", "realkv", "rows per sweep", "host (us)", "kernel (us)", "step (us)",
                   "rows / us (kernel)", "step / 16 (us)", "violations"],
                  [(w["layout"], w["realkv"], w["rows"], f"{w['host_us']:.1f}", f"{w['kernel_us']:.1f}",
                    f"{w['step_us']:.1f}", f"{w['rows_per_us']:.0f}", f"{w['step_us'] / 16:.1f}", w["violations"])
                   for w in sweeps]),
            "",
            source(name),
            "",
        ]
    else:
        lines += ["The idle-cache sweep (`bench_kernels.py --only sweep`) has no committed GPU run.", ""]
    if plan_width:
        name, r = plan_width
        us = {(w["realkv"], w["reqs"], w["ctx"], w["pool_rows"], w["rule"]): w["us"] for w in r["rows"]}
        shapes = list(dict.fromkeys((w["realkv"], w["reqs"], w["ctx"]) for w in r["rows"]))
        pools = sorted({w["pool_rows"] for w in r["rows"] if w["rule"] == "capacity" and w["pool_rows"] > 2048})
        lines += [
            "## The plan width against the req pool's capacity (`plan_width.py`)",
            "",
            "Every program rebuilds the batch's per-request block plan in registers, MAX_BS lanes wide; MAX_BS is"
            " the batch size rounded up to a power of two (at least 16), not the req pool's row count (sglang sizes"
            " req_to_token by max_running_requests + 1, 2048-4096 requests by default, which took the kernels to"
            " 255 registers with spills). MHA pre + post pass per forward, timed as the scaling table.",
            "",
            table(["realkv", "requests x context", *(f"plan by pool: {p} rows (us)" for p in pools),
                   f"plan by batch (shipped), {pools[-1]}-row pool (us)"],
                  [(mode, f"{reqs} x {ctx}", *(f"{us[mode, reqs, ctx, p, 'capacity']:.1f}" for p in pools),
                    f"{us[mode, reqs, ctx, pools[-1], 'batch']:.1f}") for mode, reqs, ctx in shapes]),
            "",
            f"Run: `results/{name}` (every pool size and MAX_BS: `results/{Path(name).with_suffix('.md')}`). One"
            " compiled variant per captured graph's batch size costs about 3.5 s of compilation for pre + post on"
            " first use (cached on disk by Triton afterwards).",
            "",
        ]
    return "\n".join(lines)


def load(folder: Path = HERE / "results") -> tuple[list[tuple[str, dict]], tuple[str, dict]]:
    runs = [(name, json.loads((folder / name).read_text())) for name in RUNS]
    return runs, (PLAN_WIDTH, json.loads((folder / PLAN_WIDTH).read_text()))


def main() -> None:
    sys.stdout.write(render(*load()))


if __name__ == "__main__":
    main()
