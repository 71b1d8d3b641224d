"""Soak: the instrumented reference engine serving for many steps with every self-test perturbation on.

For each layout, two runs of the same seeded workload (prefix sharing, follow-up turns, chunked
prefill, eviction, the SWA window) on a copy of the reference engine instrumented by the CLI:

1. perturbed: every perturbation kind at ``--rate`` per opportunity, switched on the way a user
   does (``SGLANG_KV_CANARY_PERTURB*`` variables), with the idle-cache sweep every
   ``--sweep-interval`` steps. After ``--steps`` steps the running requests finish and the sweep
   passes over the cache twice. The run is scored from its log alone: every ``kv_canary_perturb=``
   line against the ``kv_canary violation`` lines (injected vs reported, delay per kind), and every
   miss is sorted by ``perturb.audit`` (overwritten / unreachable / undetected);
2. clean: the same workload with perturbations off, which must report nothing.

Writes ``<name>.json`` and ``<name>.md`` under ``--out`` with the command and the device; exits 1
when a violation is unattributed, a miss is undetected (still corrupt and still held), or the
clean run reported anything. Results use one flush at the end of each phase: the readback stays
one step late and never waits while serving, as in production.

    python bench/runtime/soak.py --steps 2000 --out bench/runtime/results --name soak_h200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from canary_instrument.demo import engine_copy, matrix  # noqa: E402
from canary_instrument.demo.workload import Workload  # noqa: E402
from canary_instrument.runtime.perturb import KINDS, score_log  # noqa: E402
from canary_instrument.runtime.perturb.audit import audit  # noqa: E402
from canary_instrument.runtime.reports.stats import StatsLine  # noqa: E402

LOGGER = "canary_instrument.runtime"


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()})"


@contextlib.contextmanager
def environment(values: dict):
    """Set canary variables for one engine build and put the previous values back after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LogCapture(logging.Handler):
    """The runtime's log lines (violations, injections, stats) as the text a user would score."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def drain_and_sweep(engine, manager, passes: int = 2) -> None:
    """Let the running requests finish (their KV goes into the cache), then drive the idle-cache sweep
    until it has finished ``passes`` more passes over what the cache holds."""
    while not engine.scheduler.is_idle():
        engine.step()
    sweeper, cache = manager.sweeper, engine.scheduler.tree_cache
    if sweeper is None:
        return  # --sweep-interval 0: no sweep to drive
    start = sweeper.progress.passes
    # An idle engine runs no steps: drive the sweep's slices directly, at steps it is due on. Serving may end
    # on any step, so start from the next multiple of the interval (from the last step itself, every later
    # step would miss the interval and the drain would sweep nothing).
    step = (manager.step // sweeper.interval + 1) * sweeper.interval
    for _ in range(100_000):
        if sweeper.progress.passes >= start + passes:
            return
        sweeper.maybe_sweep(step, cache)
        step += sweeper.interval
    raise RuntimeError(f"soak drain: the sweep did not finish {passes} passes over the cache "
                       f"({sweeper.progress}); the idle-cache misses would be scored unswept")


def run(module, layout: str, steps: int, seed: int, environ: dict, sweep_interval: int, drain: bool) -> dict:
    """Serve ``steps`` steps; with ``drain``, let requests finish and the sweep pass twice over the cache."""
    logger = logging.getLogger(LOGGER)
    capture = LogCapture()
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # thousands of ERROR lines: scored from the capture, not printed
    try:
        with environment(environ):
            bench = matrix.EngineBench(module, matrix.Variant(layout, False), kv_canary_sweep_interval=sweep_interval)
        engine, manager = bench.engine, bench.engine.model_runner.canary_manager
        workload = Workload(engine, random.Random(seed))
        started = time.perf_counter()
        for _ in range(steps):
            workload.step()
        serve_seconds = time.perf_counter() - started
        if drain:
            drain_and_sweep(engine, manager)
        violations = manager.flush()
        if manager.perturber is not None:
            manager.perturber.drain()
        stats = manager.stats_line()
    finally:
        logger.removeHandler(capture)
        logger.propagate = True
    out = {
        "steps": steps, "serve_seconds": round(serve_seconds, 2), "manager_steps": manager.step,
        "violations": len(violations), "stats": stats.format(),
        "scheduler": {k: v for k, v in vars(engine.scheduler.stats).items()},
    }
    if manager.perturber is not None:
        result = score_log(capture.text)
        why = audit(result, manager.state, engine.scheduler.tree_cache)
        out["score"] = result.to_dict()
        out["score_table"] = result.format()
        out["misses"] = {k: [i.format() for i in v] for k, v in why.items()}
    else:
        out["first_violations"] = [v.format() for v in violations[:5]]
    out["stats_lines"] = len(StatsLine.find_all(capture.text))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", nargs="+", default=list(matrix.LAYOUTS))
    parser.add_argument("--steps", type=int, default=2000, help="serving steps per run")
    parser.add_argument("--rate", type=float, default=0.02, help="rate of every perturbation kind")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the first perturbation")
    parser.add_argument("--sweep-interval", type=int, default=4)
    parser.add_argument("--sweep-slots", type=int, default=256)
    parser.add_argument("--readback-interval", type=int, default=1,
                        help="kv_canary_readback_interval: a tagged status snapshot (health check, stats) every N "
                             "steps; violations carry the step of the forward that found them whatever N is")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="soak")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    root = Path(tempfile.mkdtemp(prefix="canary-soak-")) / "engine"
    engine_copy.copy_engine(root)
    engine_copy.instrument(root)
    module = engine_copy.import_engine(root)

    common = {"KV_CANARY_SWEEP_SLOTS": str(args.sweep_slots), "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "100",
              "KV_CANARY_READBACK_INTERVAL": str(args.readback_interval)}
    perturbed_env = {**common, "SGLANG_KV_CANARY_PERTURB": f"all={args.rate}",
                     "SGLANG_KV_CANARY_PERTURB_SEED": str(args.seed),
                     "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": str(args.warmup)}
    started = time.perf_counter()
    layouts = {}
    ok = True
    for layout in args.layouts:
        seed = args.seed * 1000 + matrix.LAYOUTS.index(layout)
        perturbed = run(module, layout, args.steps, seed, perturbed_env, args.sweep_interval, drain=True)
        clean = run(module, layout, args.steps, seed, common, args.sweep_interval, drain=False)
        layouts[layout] = {"perturbed": perturbed, "clean": clean}
        s = perturbed["score"]
        layout_ok = not s["unattributed"] and not perturbed["misses"]["undetected"] and clean["violations"] == 0
        ok &= layout_ok
        print(f"{layout}: {s['reported']}/{s['injected']} injected reported, {s['unattributed']} unattributed, "
              f"misses {({k: len(v) for k, v in perturbed['misses'].items()})}; clean: {clean['violations']} "
              f"violations in {clean['steps']} steps", flush=True)
        print(perturbed["score_table"], flush=True)
    report = {
        "command": " ".join(
            ["python"] + [str(a) for a in (sys.argv if argv is None else ["bench/runtime/soak.py", *argv])]
        ),
        "device": device_name(),
        "torch": torch.__version__,
        "cuda_graphs": torch.cuda.is_available(),
        "engine": dict(matrix.ENGINE_DEFAULTS),
        "settings": {"rate": args.rate, "warmup": args.warmup, "sweep_interval": args.sweep_interval,
                     "sweep_slots": args.sweep_slots, "readback_interval": args.readback_interval, "seed": args.seed},
        "seconds": round(time.perf_counter() - started, 1),
        "ok": ok,
        "layouts": layouts,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(render_markdown(report))
    return 0 if ok else 1


def render_markdown(report: dict) -> str:
    lines = [
        f"# Perturbation soak on {report['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']}, CUDA graphs {'on' if report['cuda_graphs'] else 'off'}, "
        f"every kind at rate {report['settings']['rate']} from step {report['settings']['warmup'] + 1}, "
        f"sweep every {report['settings']['sweep_interval']} steps "
        f"({report['settings']['sweep_slots']} slots a slice), "
        f"a tagged status snapshot every {report['settings']['readback_interval']} steps, "
        f"{report['seconds']} s, result: {'pass' if report['ok'] else 'FAIL'}.",
        "",
        "Scored from the run's log: each `kv_canary_perturb=` line against the `kv_canary violation` lines. "
        "Delay in steps from the injection to its first report. A miss is *overwritten* (the slot was reused "
        "and rewritten before anything read it), *unreachable* (freed, held by nobody) or *undetected* "
        "(still corrupt and held: a real miss).",
        "",
    ]
    for layout, runs in report["layouts"].items():
        p, c = runs["perturbed"], runs["clean"]
        s = p["score"]
        lines += [
            f"## {layout}",
            "",
            "| kind | injected | reported | missed | delay min / median / max |",
            "|---|---:|---:|---:|---|",
        ]
        for kind in KINDS:
            k = s["kinds"][kind]
            delay = "-" if k["delay_min"] is None else f"{k['delay_min']} / {k['delay_median']:g} / {k['delay_max']}"
            lines.append(f"| {kind} | {k['injected']} | {k['reported']} | {len(k['missed'])} | {delay} |")
        misses = ", ".join(f"{k} {len(v)}" for k, v in p["misses"].items())
        lines += [
            f"| all | {s['injected']} | {s['reported']} | {s['injected'] - s['reported']} | |",
            "",
            f"Perturbed: {p['steps']} steps ({p['serve_seconds']} s), {s['violations']} violation records, "
            f"{s['unattributed']} unattributed, {s['not_applied']} injections not applied; misses: {misses}.  ",
            f"Clean: {c['steps']} steps ({c['serve_seconds']} s), **{c['violations']} violations**.  ",
            f"Last stats line (perturbed): `{p['stats']}`  ",
            f"Last stats line (clean): `{c['stats']}`",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
