"""`canary-instrument demo`: instrument a copy of the reference engine, then try to break it.

Copies the pristine engine, runs scaffold / check / apply / check on it as a user would,
runs clean workloads and one fault-injection trial per (layout, EAGLE on/off, fault),
and prints what the canary caught, how fast, and what it costs; then HiCache's host tier
with and without the runtime's sidecar (demo/hicache_trials.py) and, on CUDA, the stream race that
timing jitter reveals (demo/jitter_race.py). Exit 0 when every fault was caught, no clean
step reported anything and, where it ran, the race showed only with jitter.
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import click

from canary_instrument.demo.faults import FAULTS
from canary_instrument.runtime.passes.state import REASON_NAMES

LAYOUT_CHOICES = ("mha", "mla", "swa")
REASON_ORDER = [name for _, name in sorted(REASON_NAMES.items())]  # reason-bit order


@click.command(
    "demo",
    help="Instrument a copy of the bundled reference engine (scaffold, check, apply), run it clean and "
    "under every fault class on MHA, MLA and SWA pools with and without EAGLE (HiCache's host tier with and "
    "without the canary's sidecar; on CUDA, a stream race with and without timing jitter), and print what "
    "the canary caught and what it cost.",
)
@click.option("--layout", "layouts", multiple=True, type=click.Choice(LAYOUT_CHOICES),
              help="Pool layouts to run (repeatable; default: all three).")
@click.option("--trials", default=1, show_default=True, type=click.IntRange(1),
              help="Fault-injection trials per layout, EAGLE setting and fault.")
@click.option("--clean-steps", default=100, show_default=True, type=click.IntRange(1),
              help="Steps of the clean run per layout and EAGLE setting.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of workloads and injections.")
@click.option("--no-overhead", is_flag=True, help="Skip the overhead measurement.")
@click.option("--keep", "keep_dir", type=click.Path(file_okay=False), default=None,
              help="Instrument the engine copy in this (new) folder and keep it, instead of a temporary one.")
def demo(layouts, trials, clean_steps, seed, no_overhead, keep_dir):
    started = time.perf_counter()
    layouts = tuple(layouts) or LAYOUT_CHOICES
    if keep_dir is not None:
        if Path(keep_dir).exists():
            raise click.UsageError(f"--keep {keep_dir}: the folder exists; name a new one")
        ok = _run(Path(keep_dir), layouts, trials, clean_steps, seed, no_overhead)
    else:
        with tempfile.TemporaryDirectory(prefix="canary-demo-") as tmp:
            ok = _run(Path(tmp) / "engine", layouts, trials, clean_steps, seed, no_overhead)
    click.echo(f"\nDone in {time.perf_counter() - started:.0f} s.")
    sys.exit(0 if ok else 1)


def _run(root: Path, layouts, trials: int, clean_steps: int, seed: int, no_overhead: bool) -> bool:
    from canary_instrument.demo import engine_copy

    click.secho("1. Instrument a copy of the reference engine", bold=True)
    engine_copy.copy_engine(root)
    click.echo(f"   copied the pristine engine to {root / engine_copy.ENGINE_PACKAGE}")
    try:
        report = engine_copy.instrument(root)
    except engine_copy.ToolFailed as error:
        click.secho(f"   {error}", fg="red")
        return False
    _print_diff("scaffold", report["scaffold_diff"], "placeholders inserted")
    click.echo("   check     exit 0: every site holds a placeholder")
    _print_diff("apply", report["apply_diff"], "placeholders wired to the canary runtime")
    click.echo("   check     exit 0: wired tree is consistent")

    # torch loads only now: the rewriting steps above never needed it.
    import torch

    from canary_instrument.demo import matrix

    # The engine's tensors are tiny: one intra-op thread beats handing each op to a pool.
    torch.set_num_threads(1)

    matrix.quiet_canary_log()
    module = engine_copy.import_engine(root)
    variants = matrix.all_variants(layouts)
    jobs = [(v, None, 0) for v in variants]
    jobs += [(v, f, t) for v in variants for f in matrix.faults_for(v) for t in range(trials)]

    click.secho(f"\n2. Run {len(variants)} engine variants clean, then inject {len(jobs) - len(variants)} faults",
                bold=True)
    benches, cleans, results = {}, {}, defaultdict(list)
    with click.progressbar(jobs, label="   running", file=sys.stderr,
                           item_show_func=lambda j: j and f"{j[0].label} {j[1].name if j[1] else 'clean'}") as bar:
        for variant, fault, trial in bar:
            if variant not in benches:
                benches[variant] = matrix.EngineBench(module, variant)
            bench = benches[variant]
            if fault is None:
                cleans[variant] = bench.clean_run(clean_steps, seed)
            else:
                results[(variant, fault.name)].append(bench.run_trial(fault, seed * 1000 + trial))

    _print_clean(cleans)
    swa_refusal = None
    if any(f.refused(v.layout, v.eagle) for v in variants for f in FAULTS.values()):
        from canary_instrument.demo.hicache_trials import swa_refusal as refusal

        swa_refusal = refusal(module, matrix.ENGINE_DEFAULTS)
    _print_matrix(variants, results, swa_refusal)
    hicache_runs = _run_hicache(benches, variants, clean_steps, seed)
    _print_hicache(hicache_runs, swa_refusal)
    jitter_runs = _run_and_print_jitter(module)
    if not no_overhead:
        _print_overhead(module, layouts)
    ok = _summary(cleans, results, hicache_runs)
    if jitter_runs is not None:
        from canary_instrument.demo.jitter_race import as_expected

        ok = ok and as_expected(jitter_runs)
    return ok


def _print_diff(command: str, diffs, what: str):
    added = sum(d.added for d in diffs)
    removed = sum(d.removed for d in diffs)
    click.echo(f"   {command:<9} exit 0: {len(diffs)} files, +{added} -{removed} lines ({what})")
    for d in diffs:
        click.echo(f"     {d.path:<62} +{d.added:<3} -{d.removed}")


def _print_clean(cleans):
    click.secho("\n   Clean runs (log mode, real-KV fingerprint of the first 16 bytes)", bold=True)
    header = f"   {'variant':<10} {'steps':>5} {'violations':>10} {'prefix hits':>11} {'evicted':>7} " \
             f"{'SWA released':>12} {'drafts accepted':>15}"
    click.echo(header)
    for variant, clean in cleans.items():
        s = clean.stats
        drafts = f"{s.accepted_drafts}/{s.proposed_drafts}" if variant.eagle else "-"
        swa = str(s.swa_released_tokens) if variant.layout == "swa" else "-"
        color = "green" if not clean.violations else "red"
        click.echo(f"   {variant.label:<10} {clean.steps:>5} " + click.style(f"{len(clean.violations):>10}", fg=color)
                   + f" {s.prefix_hit_tokens:>11} {s.evicted_tokens:>7} {swa:>12} {drafts:>15}")


def _cell(trials) -> str:
    caught = [t for t in trials if t.caught]
    if len(caught) < len(trials):
        return click.style(f"MISSED {len(trials) - len(caught)}/{len(trials)}", fg="red")
    delays = sorted(t.delay for t in caught)
    when = f"+{delays[0]}" if delays[0] == delays[-1] else f"+{delays[0]}..{delays[-1]}"
    reasons = {r for t in caught for r in (set(t.example.reasons) & t.injection.expected_reasons)}
    reason = min(reasons, key=REASON_ORDER.index) + ("+" if len(reasons) > 1 else "")
    count = f"{len(caught)}/{len(trials)} " if len(trials) > 1 else ""
    return click.style(f"{count}{when} {reason}", fg="green")


def _print_matrix(variants, results, swa_refusal=None):
    click.secho("\n3. Fault matrix: steps from the corruption to its report, with the reason "
                "(+ = other trials saw another expected reason)", bold=True)
    click.echo("   Most faults are the runtime's own self-test perturbations (kv_canary_perturb), armed once. One made\n"
               "   before a step's forward is caught by that forward (+0); a bit flipped after a forward wrote it, by the\n"
               "   next read (+1 or later); a bit flipped in an idle cached prefix, by the idle-cache sweep (every 2 steps).\n"
               "   A draft offset is caught when the draft's rows are next compared with the target's (+1 or later).\n"
               "   A wrong input token for a decode riding in a mixed batch runs on an engine with mixed chunks and the\n"
               "   token oracle (SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1): only the oracle's input check sees it.\n"
               "   The HiCache faults run on an engine whose prefix cache keeps KV in a host pool too (section 4), and\n"
               "   are counted from the load that brings the corruption back to the device.")
    width = 16
    click.echo("   " + f"{'fault':<34}" + "".join(f"{v.label:<{width}}" for v in variants))
    for fault in FAULTS.values():
        cells = []
        for v in variants:
            trials = results.get((v, fault.name))
            if fault.refused(v.layout, v.eagle):
                text = click.style("refused", fg="yellow")
            else:
                text = _cell(trials) if trials else click.style("n/a", dim=True)
            cells.append(text + " " * max(1, width - len(click.unstyle(text))))
        click.echo("   " + f"{fault.title:<34}" + "".join(cells))
    if swa_refusal is not None:
        click.echo(textwrap.fill(f"refused: the runtime refuses HiCache of an SWA pool at attach ({swa_refusal}).",
                                 width=110, initial_indent="   ", subsequent_indent="     "))
    example = next((t for ts in results.values() for t in ts if t.caught), None)
    if example is not None:
        click.echo(f"\n   For example ({example.variant.label}, {FAULTS[example.fault].title}):")
        click.echo(f"     injected: {example.injection.description}")
        click.echo(f"     reported: {example.example.format()}")


def _run_hicache(benches, variants, clean_steps: int, seed: int) -> list:
    from canary_instrument.demo import hicache_trials

    faults = [f for f in FAULTS.values() if f.hicache_kind is not None]
    runs = []
    for variant in variants:
        if faults and faults[0].applies(variant.layout, variant.eagle):
            runs.append(hicache_trials.run_layout(benches[variant].bench_for(faults[0]), faults,
                                                  hicache_trials.clean_steps(clean_steps), seed))
    return runs


def _print_hicache(runs, swa_refusal):
    if not runs and swa_refusal is None:
        return
    click.secho("\n4. HiCache: canary rows through the host tier, with the runtime's sidecar and without it", bold=True)
    if runs:
        pools = ", ".join(sorted({r.host_pool for r in runs}))
        click.echo(textwrap.fill(
            "The engine's prefix cache backs its KV up to a host pool and loads it back on a prefix hit, here with "
            "a user returning to an evicted conversation every few steps; the runtime found the host pool by "
            f"structure ({pools}) and copies the canary rows beside it.",
            width=110, initial_indent="   ", subsequent_indent="   "))
        click.echo(f"   {'layout':<6} {'sidecar':<8} {'steps':>5} {'loaded back':>11} {'violations':>10}")
        for run in runs:
            for label, clean in (("on", run.with_sidecar), ("off", run.without_sidecar)):
                color = "green" if (label == "on") == (not clean.violations) else "red"
                click.echo(f"   {run.layout:<6} {label:<8} {clean.steps:>5} {run.loaded_back:>11} "
                           + click.style(f"{len(clean.violations):>10}", fg=color))
        click.echo("   Without the sidecar every load-back reads rows of the slots' earlier holders. The matrix's HiCache\n"
                   "   faults without the sidecar, each against the same steps without the fault:")
        for name in runs[0].controls:
            cells = []
            for run in runs:
                control = run.controls[name]
                if control.injection is None:
                    text = click.style("not injected", fg="red")
                elif control.missed:
                    text = click.style(f"missed ({len(control.at_fault)} reported = without the fault)", fg="green")
                else:
                    text = click.style(f"reported {len(control.at_fault)}, without the fault "
                                       f"{len(control.at_same_step_clean)}", fg="yellow")
                cells.append(f"{run.layout}: {text}")
            click.echo(f"   {FAULTS[name].title:<34}" + "   ".join(cells))
    if swa_refusal is not None:
        click.echo("   swa: refused at attach (the matrix's note); the engine has no host tier for a window pool either.")


def _run_and_print_jitter(module):
    """The jitter race (demo/jitter_race.py) on an MHA engine: its three runs, or None where it cannot run."""
    from canary_instrument.demo import jitter_race

    click.secho("\n5. Timing jitter: a KV write on a side stream that the forward never waits for", bold=True)
    reason = jitter_race.unavailable()
    if reason is not None:
        click.echo(textwrap.fill(
            f"not run: {reason}. On a CUDA machine this section runs the race with jitter off, on "
            f"(SGLANG_KV_CANARY_JITTER_POINTS={jitter_race.JITTER_POINTS}, up to {jitter_race.JITTER_US // 1000} ms) "
            "and on with the stream wait restored.", width=110, initial_indent="   ", subsequent_indent="   "))
        return None

    def make(args):
        engine = module.Engine(**args)
        return engine, engine.model_runner.canary_manager

    runs = jitter_race.run_all(make)
    click.echo(f"   mha engine, {len(jitter_race.PROMPTS)} requests x {jitter_race.STEPS} new tokens, real-KV "
               "fingerprints of every layer, eager decode:")
    labels = ("jitter off", f"jitter at {jitter_race.JITTER_POINTS}, up to {jitter_race.JITTER_US // 1000} ms",
              "the same jitter, stream wait restored")
    for label, run, expect in zip(labels, runs, (False, True, False)):
        reasons = ", ".join(sorted(run.reasons)) or "-"
        color = "green" if bool(run.violations) == expect else "red"
        click.echo(f"   {label:<42}" + click.style(f"{len(run.violations):>6} violations", fg=color)
                   + f"  ({reasons})")
    return runs


def _print_overhead(module, layouts):
    from canary_instrument.demo.overhead import committed_gpu_overhead, measure_overhead

    click.secho("\n6. Canary overhead: median decode step, canary off vs on (log, real-KV partial)", bold=True)
    devices = set()
    for layout in layouts:
        o = measure_overhead(module, layout)
        devices.add(o.device)
        click.echo(f"   {layout:<4} off {o.off_ms:7.2f} ms   on {o.on_ms:7.2f} ms   ({o.percent:+.0f} %, "
                   f"{o.decode_steps} decode steps, {o.backend} backend, {o.device}, {o.violations} violations)")
    if devices == {"cpu"}:
        click.echo("   This is a toy step: a 64-wide, 2-layer model run eagerly on this CPU, with the canary's torch\n"
                   "   reference kernels executing on the CPU too. It says nothing about a serving step on a GPU.")
    else:
        click.echo("   The demo engine is tiny (64-wide, 2 layers): its step is mostly launch overhead, so the relative\n"
                   "   cost here is far above that of a serving-sized step.")
    gpu = committed_gpu_overhead()
    if gpu is None:
        click.echo("   The GPU figure (Llama-3-8B decode step, CUDA graphs) is in bench/engine/results/step_floor_*.md of\n"
                   "   the source repository.")
        return
    click.echo(f"   Committed GPU figure ({gpu.device}, Llama-3-8B decode step, CUDA graphs, realkv=partial, "
               f"bench/engine/results/{gpu.page}):")
    for line in gpu.lines():
        click.echo(f"     {line}")


def _summary(cleans, results, hicache_runs=()) -> bool:
    trials = [t for ts in results.values() for t in ts]
    caught = sum(t.caught for t in trials)
    with_sidecar = [r.with_sidecar for r in hicache_runs]
    false_alarms = (sum(len(c.violations) for c in (*cleans.values(), *with_sidecar))
                    + sum(len(t.false_alarms) for t in trials))
    clean_steps = sum(c.steps for c in (*cleans.values(), *with_sidecar))
    ok = caught == len(trials) and false_alarms == 0
    line = (f"\nResult: {caught}/{len(trials)} injected faults caught; {false_alarms} violations in "
            f"{clean_steps} clean steps and the clean steps before each injection.")
    click.secho(line, fg="green" if ok else "red", bold=True)
    return ok
