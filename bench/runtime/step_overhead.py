"""Host time the canary adds to each decode step of the instrumented reference engine, and the ops it issues.

A copy of the reference engine (golden/engine) is instrumented with the real CLI (scaffold,
check, apply) and built twice, canary off and on (log mode, real-KV partial); `bs` requests are
prefilled, then decoded. Every generated `canary_ctx` member (the wired sites) is wrapped so the
host time of building, entering and leaving the canary's contexts is summed per scheduler step:
with the canary on that is the outside-graph phases (phase checks, step count, readback) and the
sub-forward routing, with it off the null contexts the same sites return. The canary's sampler
wrapper (on) is timed too: as a whole, minus the engine's own sample timed inside it, so its frame
and the record count (the inner timer's own few calls too: a slight overcount). What runs between a
context's entry and exit (the model forward, a CUDA-graph replay) is not counted. The bracket's host
work inside eager forwards (plan + kernel launches; none when a CUDA graph replays) is reported beside
it, not in the total.
On CUDA every decode step replays CUDA graphs, as sglang runs it: the target's decode graph, or
with EAGLE the multi-step draft chain, the target verify and the draft-extend, each with the
canary's passes recorded inside. The benchmark counts the replays and the eager bracketed forwards
of every timed step and refuses a step that fell back to an eager forward (a batch above the
captured sizes, a runner that was not captured); `--disable-cuda-graph` measures the eager engine
instead. Medians over --steps decode steps; a second pass under torch.profiler counts the aten ops
issued inside the timed canary phases.

On CUDA, the first CUDA call after a graph launch waits while the driver submits the graph (tens of
microseconds for the engine's decode graph, measured with an untimed stream query before the site's
exit). Whichever call comes first pays it: without the canary it is the engine's own next call. So
before each timed site exit an untimed `current_stream().query()` absorbs it, canary on and off
alike (`--no-absorb` keeps it in). `--readback-interval N` runs the canary with
`KV_CANARY_READBACK_INTERVAL=N` (a tagged status snapshot every N steps; the runtime's default is
64). `--sweep-interval N` switches the idle-cache sweep on (off by default, as in the runtime);
`--no-token-check` runs without the sampled-token check, so without the sampler wrap.
After each site exit an empty Python call is timed (untimed for the canary): what the host's Python
costs at that point of the step, as a yardstick for the sites' figures. `--interleave N` builds both
engines first and times them in alternating blocks of N steps: on a shared host the off engine's
figure then moves with the on engine's instead of being taken minutes apart.

    PYTHONPATH=. python bench/runtime/step_overhead.py --out bench/runtime/results/cpu.json
    PYTHONPATH=$PWD python bench/runtime/step_overhead.py --device cuda --out $OUT/gpu.json
    PYTHONPATH=$PWD python bench/runtime/step_overhead.py --device cuda --subs 3 --bs 8 64 256 --out $OUT/gpu_eagle.json
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from canary_instrument.demo import engine_copy, matrix  # noqa: E402
from canary_instrument.runtime.setup.settings import CanarySettings  # noqa: E402

PROMPT = 32
# Ops that only make a tensor view or wrap a value: no kernel, no copy on any device.
METADATA_OPS = {
    "aten::slice", "aten::select", "aten::view", "aten::as_strided", "aten::unsqueeze", "aten::expand",
    "aten::reshape", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::to", "aten::t", "aten::permute", "aten::empty", "aten::empty_strided",
    "aten::from_blob", "aten::_reshape_alias", "aten::squeeze", "aten::unbind",
}


class Clock:
    """Host seconds spent in the canary's phases during the current step."""

    def __init__(self):
        self.sites = 0.0  # wired sites: building, entering and leaving their contexts
        self.sample = 0.0  # the canary's sampler wrapper around the engine's sample (its frame and the record)
        self.sample_inner = 0.0  # the engine's own sample, timed inside the wrapper (subtracted)
        self.bracket = 0.0  # bracketed forwards' pre/post ops (eager forwards only)
        self.eager_forwards = 0  # bracketed model forwards run eagerly (pre-ops called outside a capture)
        self.call = []  # host seconds of one empty Python call, timed right after each site exit (calibration)
        self.replays: collections.Counter = collections.Counter()  # CUDA-graph replays per graph runner
        self.profiling = False
        self.absorb = None  # called before each timed site exit (see _Timed.__exit__)
        self.parts: collections.Counter = collections.Counter()  # the sites' host seconds by part (see _add)

    def reset(self):
        self.sites = self.sample = self.bracket = 0.0
        self.sample_inner = 0.0
        self.eager_forwards = 0
        self.call = []
        self.replays.clear()
        self.parts.clear()


def _add(part: str, seconds: float) -> None:
    """Count ``seconds`` of the sites' host time, and under ``part`` (which class's site, entry or exit, or
    which allocator note) for the breakdown."""
    CLOCK.sites += seconds
    CLOCK.parts[part] += seconds


CLOCK = Clock()


def _marker(name):
    return record_function(name) if CLOCK.profiling else _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Timed:
    """A wired site's context, with its entry and exit timed."""

    __slots__ = ("_cm", "_part")

    def __init__(self, cm, part):
        self._cm = cm
        self._part = part

    def __enter__(self):
        if CLOCK.absorb is not None:
            CLOCK.absorb()  # as before the exit: the previous graph launch's submission is not the site's
        with _marker("canary.sites"):
            t0 = time.perf_counter()
            value = self._cm.__enter__()
            _add(self._part + " enter", time.perf_counter() - t0)
        return value

    def __exit__(self, *exc):
        if CLOCK.absorb is not None:
            # Untimed, canary on and off alike: the first CUDA call after a graph launch waits while the
            # driver submits the graph; the engine's own next call would wait there if the canary's did not.
            CLOCK.absorb()
        with _marker("canary.sites"):
            t0 = time.perf_counter()
            out = self._cm.__exit__(*exc)
            _add(self._part + " exit", time.perf_counter() - t0)
        # Calibration, untimed for the canary: what one empty Python call costs here, at the same point
        # of the step (the host's caches as the engine's own work left them).
        t0 = time.perf_counter()
        for _ in range(CALIBRATION_CALLS):
            _nothing()
        CLOCK.call.append((time.perf_counter() - t0) / CALIBRATION_CALLS)
        return out


CALIBRATION_CALLS = 10


def _nothing():
    return None


def _time_sites(module) -> int:
    """Wrap the generated ``canary_ctx`` member of every engine class that has one; returns how many."""
    import importlib
    import inspect

    wrapped = 0
    for name in ("model_executor.model_runner", "model_executor.cuda_graph_runner",
                 "speculative.eagle_worker_v2", "speculative.eagle_draft_extend_cuda_graph_runner"):
        mod = importlib.import_module(f"{module.__name__.split('.')[0]}.srt.{name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            member = cls.__dict__.get("canary_ctx")
            if member is None or getattr(member, "_timed", False):
                continue

            def canary_ctx(self, *args, _member=member, _part=cls.__name__, **kwargs):
                with _marker("canary.sites"):
                    t0 = time.perf_counter()
                    cm = _member(self, *args, **kwargs)
                    _add(_part + " make", time.perf_counter() - t0)
                return _Timed(cm, _part)

            canary_ctx._timed = True
            cls.canary_ctx = canary_ctx
            wrapped += 1
    return wrapped


def timed_engine(prefix: str):
    """A copy of the reference engine, instrumented with the real CLI and imported, its wired sites timed
    (``_time_sites``); the canary's log lines are kept off the terminal."""
    matrix.quiet_canary_log()
    root = Path(tempfile.mkdtemp(prefix=prefix)) / "engine"
    engine_copy.copy_engine(root)
    engine_copy.instrument(root)
    module = engine_copy.import_engine(root)
    if _time_sites(module) < 4:
        raise RuntimeError("fewer wired classes than expected: is the engine copy instrumented?")
    _time_engine_sample(module)
    _time_allocator_notes()
    return module


def _time_allocator_notes() -> None:
    """Count the canary's notes of req-pool allocations and KV frees (runtime/checks/request_side.py, called from the
    engine's wrapped allocators, outside any site) into the sites' time: they are the canary's host work."""
    from canary_instrument.runtime.checks.request_side import RequestSide

    for name in ("on_alloc", "on_free"):
        note = getattr(RequestSide, name)
        if getattr(note, "_timed", False):
            continue

        def timed(self, *args, _note=note, _part=name, **kwargs):
            with _marker("canary.sites"):
                t0 = time.perf_counter()
                out = _note(self, *args, **kwargs)
                _add(_part, time.perf_counter() - t0)
            return out

        timed._timed = True
        setattr(RequestSide, name, timed)


def _time_engine_sample(module) -> None:
    """Time the engine's own ``ModelRunner.sample`` (on the class, before any engine is built: the canary's
    wrapper calls the function it finds there), so that the wrapper's share is its total minus this."""
    import importlib

    cls = importlib.import_module(f"{module.__name__.split('.')[0]}.srt.model_executor.model_runner").ModelRunner
    sample = cls.sample

    def timed_sample(self, *args, **kwargs):
        with _marker("engine.sample"):  # the engine's own ops: not counted in the canary's phase (_phase_of)
            t0 = time.perf_counter()
            out = sample(self, *args, **kwargs)
            CLOCK.sample_inner += time.perf_counter() - t0
        return out

    cls.sample = timed_sample


def _time_sample_wrap(runner) -> None:
    """Time the canary's sampler wrapper as a whole (on the instance, around it): with the engine's own sample
    timed inside (``_time_engine_sample``), the difference is the canary's share, its own frame included."""
    wrapper = runner.__dict__.get("sample")
    if wrapper is None:
        return  # no wrapper on this runner (a draft runner, or the canary off)

    def timed_wrapper(*args, **kwargs):
        inner = CLOCK.sample_inner
        with _marker("canary.sample"):
            t0 = time.perf_counter()
            out = wrapper(*args, **kwargs)
            spent = time.perf_counter() - t0
        CLOCK.sample += spent - (CLOCK.sample_inner - inner)
        return out

    runner.sample = timed_wrapper


# --replay-emulation: on the CPU, the sites around forwards whose canary Python does what a graph replay does.
REPLAY_EMULATION = False


def _emulate_replays(manager) -> None:
    """After init, the bracketed forward's canary Python does what a CUDA-graph replay does on the host: nothing.
    The two pass counters a replayed graph's passes would advance are advanced (the health check compares them
    with the planned passes), so the sites' entries and exits take the path they take on a GPU with graphs."""
    pre, post = manager.pre_ops_maybe_inside_graph, manager.post_ops_maybe_inside_graph
    counters = manager.state.counters

    def replayed_pre(*args, **kwargs):
        if not manager.steps.init_finished:
            return pre(*args, **kwargs)
        counters[0] += 1
        counters[1] += 1
        return None

    def replayed_post(*args, **kwargs):
        return None if manager.steps.init_finished else post(*args, **kwargs)

    manager.pre_ops_maybe_inside_graph = replayed_pre
    manager.post_ops_maybe_inside_graph = replayed_post


def _time_manager(manager) -> None:
    """Time the bracket's pre/post ops of one manager (on the instance)."""
    if REPLAY_EMULATION:
        _emulate_replays(manager)

    def timed(fn, attr):
        def run(*args, **kwargs):
            with _marker(f"canary.{attr}"):
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                setattr(CLOCK, attr, getattr(CLOCK, attr) + time.perf_counter() - t0)
            return out

        return run

    def counted(fn):
        def run(*args, **kwargs):
            CLOCK.eager_forwards += 1  # a replay runs no Python: only an eager forward gets here
            return fn(*args, **kwargs)

        return run

    manager.pre_ops_maybe_inside_graph = counted(timed(manager.pre_ops_maybe_inside_graph, "bracket"))
    manager.post_ops_maybe_inside_graph = timed(manager.post_ops_maybe_inside_graph, "bracket")


def graph_runners(engine) -> dict:
    """The engine's captured CUDA-graph runners by role (none on CPU or with graphs disabled)."""
    spec = engine.spec_worker
    runners = {
        # The target's runner captures its decode forward, or with EAGLE its verify forward.
        "target": engine.model_runner.graph_runner,
        "draft": spec.cuda_graph_runner if spec is not None else None,
        "draft_extend": spec.cuda_graph_runner_for_draft_extend if spec is not None else None,
    }
    return {name: runner for name, runner in runners.items() if runner is not None}


def _count_replays(runners: dict) -> None:
    """Count each runner's replays into CLOCK (on the instance; the replay itself is untouched)."""
    for name, runner in runners.items():
        def replay(*args, _replay=runner.replay, _name=name, **kwargs):
            CLOCK.replays[_name] += 1
            return _replay(*args, **kwargs)

        runner.replay = replay


class Case:
    """One engine (canary on or off) with ``bs`` requests decoding; ``subs`` draft sub-forwards (EAGLE) or 1."""

    def __init__(self, module, bs: int, subs: int, canary: bool, steps: int, device: str, graphs: bool = True,
                 sweep_interval: int = 0, real_kv: str = "partial"):
        # Free the engines of earlier cases first: this harness's patches on them (replay counters, timers)
        # make reference cycles, and a collection that frees their CUDA graphs while this engine captures
        # invalidates the capture (it did when a third engine was built in one process). Dead engines also leave the heap larger.
        gc.collect()
        eagle = subs > 1
        per_step = subs + 2 if eagle else 1  # tokens a step may add: accepted drafts + bonus
        new_tokens = steps * per_step + 16
        context = PROMPT + new_tokens + 64
        args = dict(matrix.ENGINE_DEFAULTS, attention_layout="mha", device=device, max_running_requests=bs,
                    cuda_graph_max_bs=bs, max_context_len=context, max_total_tokens=bs * context + 64,
                    chunked_prefill_size=bs * PROMPT, disable_radix_cache=True,
                    kv_canary="log" if canary else "none", kv_canary_real_kv=real_kv,
                    kv_canary_sweep_interval=sweep_interval, disable_cuda_graph=not graphs)
        if eagle:
            args.update(speculative_algorithm="EAGLE", speculative_num_steps=subs + 1)
        self.engine = module.Engine(**args)
        self.device = device
        self.graph_runners = graph_runners(self.engine)
        # What every decode step must replay: on CUDA with graphs on, each captured runner once.
        self.expected_replays = dict.fromkeys(self.graph_runners, 1)
        if device == "cuda" and graphs:
            roles = {"target", "draft", "draft_extend"} if eagle else {"target"}
            if set(self.graph_runners) != roles:
                raise RuntimeError(f"expected CUDA-graph runners {sorted(roles)}, got {sorted(self.graph_runners)}")
        _count_replays(self.graph_runners)
        self.managers = [m for m in (getattr(r, "canary_manager", None) for r in self.engine.model_runners) if m]
        if canary:
            for manager in self.managers:
                _time_manager(manager)
            for runner in self.engine.model_runners:
                _time_sample_wrap(runner)
            draft = [m for m in self.managers if m.state.token_offset == 1]
            if eagle and draft[0].num_single_forward != subs:
                raise RuntimeError(f"expected {subs} draft sub-forwards, got {draft[0].num_single_forward}")
        gen = torch.Generator().manual_seed(0)
        for _ in range(bs):
            self.engine.add_request(torch.randint(1, 128, (PROMPT,), generator=gen).tolist(), new_tokens)
        while self.engine.scheduler.waiting or self.engine.scheduler.chunked_req is not None:
            self.engine.step()

    def step(self) -> tuple[float, float, float, int, float]:
        """One decode step; the host seconds of the wired sites, the sampler wrap and the bracket, the
        eager bracketed forwards it ran (canary on only; 0 when every forward replayed a graph), and the
        cost of one empty Python call after the site exits (calibration). ``CLOCK.parts`` keeps the
        sites' seconds by part."""
        CLOCK.reset()
        batch = self.engine.step()
        if batch is None or not batch.forward_mode.is_decode() or len(self.engine.scheduler.running) != len(batch.reqs):
            raise RuntimeError("the measured requests left decode or finished: raise the step budget")
        if dict(CLOCK.replays) != self.expected_replays:
            raise RuntimeError(f"a decode step replayed {dict(CLOCK.replays)}, expected {self.expected_replays}: "
                               "a forward fell back to eager")
        return CLOCK.sites, CLOCK.sample, CLOCK.bracket, CLOCK.eager_forwards, statistics.median(CLOCK.call)


def _phase_of(event):
    """The canary phase an op ran in, or None (outside them, or in the engine's own work inside one)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("engine."):
            return None
        if parent.name.startswith("canary."):
            return parent.name[len("canary."):]
        parent = parent.cpu_parent
    return None


def _top_level(event) -> bool:
    """An aten op the canary called itself (not one nested inside another aten op)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("canary."):
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return event.name.startswith("aten::")


def count_ops(case: Case, steps: int) -> dict:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device == "cuda" else [])
    CLOCK.profiling = True
    try:
        with profile(activities=activities) as prof:
            for _ in range(steps):
                case.step()
    finally:
        CLOCK.profiling = False
    per_phase = collections.defaultdict(collections.Counter)
    for ev in prof.events():
        phase = _phase_of(ev)
        if phase is not None and _top_level(ev):
            per_phase[phase][ev.name] += 1
    return {
        phase: {
            "aten_ops": sum(names.values()) / steps,
            # Each of these is a kernel launch or a copy when its tensors are on a GPU.
            "work_ops": sum(v for k, v in names.items() if k not in METADATA_OPS) / steps,
            "by_name": {k: v / steps for k, v in sorted(names.items())},
        }
        for phase, names in per_phase.items()
    }


class _Samples:
    """One case's per-step figures: the sites', the sampler wrap's, the bracket's, the calibration call's,
    the eager bracketed forwards and the sites' time by part."""

    def __init__(self):
        self.sites, self.sample, self.bracket, self.call = [], [], [], []
        self.eager = 0
        self.parts = collections.defaultdict(list)

    def take(self, case: "Case", steps: int) -> None:
        for _ in range(steps):
            a, b, c, d, e = case.step()
            for part, seconds in CLOCK.parts.items():
                self.parts[part].append(seconds)
            self.sites.append(a)
            self.sample.append(b)
            self.bracket.append(c)
            self.eager += d
            self.call.append(e)


def run_case(module, bs, subs, steps, warmup, profile_steps, device, graphs=True, sweep_interval=0,
             real_kv="partial", interleave=0):
    """One (bs, sub-forwards) row. ``interleave`` > 0: both engines are built first and their timed steps
    taken in alternating blocks of that many steps, so that what the host does meanwhile (other tenants,
    frequency) falls on both alike; 0: the canary-off engine's steps, then the canary-on engine's."""
    us = lambda xs: round(statistics.median(xs) * 1e6, 2)  # noqa: E731
    row = dict(bs=bs, sub_forwards=subs, steps=steps, interleave=interleave)
    samples = {False: _Samples(), True: _Samples()}
    cases = {}
    for canary in (False, True):
        case = Case(module, bs, subs, canary, warmup + steps + profile_steps, device, graphs, sweep_interval, real_kv)
        for _ in range(warmup):
            case.step()
        if interleave:
            cases[canary] = case
            continue
        samples[canary].take(case, steps)
        _finish(row, case, samples[canary], canary, steps, profile_steps, us)
        del case
    if interleave:
        for start in range(0, steps, interleave):
            for canary in (False, True):
                samples[canary].take(cases[canary], min(interleave, steps - start))
        for canary in (False, True):
            _finish(row, cases[canary], samples[canary], canary, steps, profile_steps, us)
        cases.clear()
    row["added_us"] = round(row["on_total_us"] - row["off_sites_us"], 2)
    return row


def _finish(row: dict, case: "Case", got: _Samples, canary: bool, steps: int, profile_steps: int, us) -> None:
    """``row``'s figures of one case (canary on: also its ops, and no violation allowed)."""
    key = "on" if canary else "off"
    row[f"{key}_sites_us"] = us(got.sites)
    row[f"{key}_python_call_us"] = round(statistics.median(got.call) * 1e6, 3)
    # Per step, mean and median (a part that some steps skip, such as a note, counts 0 there).
    row[f"{key}_parts_us"] = {
        part: {"mean": round(sum(xs) / steps * 1e6, 2),
               "median": round(statistics.median(xs + [0.0] * (steps - len(xs))) * 1e6, 2)}
        for part, xs in sorted(got.parts.items())
    }
    if canary:
        # Every timed step replayed these (each step is checked); forwards outside them ran eagerly.
        row.update(graph_replays_per_step=case.expected_replays, eager_forwards_per_step=got.eager / steps)
        total = [a + b for a, b in zip(got.sites, got.sample)]
        row.update(on_sample_us=us(got.sample), on_total_us=us(total),
                   on_total_p90_us=round(sorted(total)[int(len(total) * 0.9)] * 1e6, 2),
                   on_bracket_us=us(got.bracket), ops=count_ops(case, profile_steps))
        found = [v for m in case.managers for v in m.flush()]
        if found:
            raise RuntimeError(f"the clean benchmark run reported {len(found)} violations: {found[0].format()}")


def _replays(row) -> str:
    found = row.get("graph_replays_per_step")  # absent in results of older commits
    if found is None:
        return ""
    return ", ".join(f"{name} {n}" for name, n in found.items()) or "none"


def markdown(rows) -> str:
    lines = [
        "| bs | sub-forwards | off: sites (us) | on: sites (us) | on: sampler wrap (us) | on: total (us, median) | "
        "on: total p90 (us) | added by the canary (us) | aten ops in the phases (of which kernel or copy) | "
        "bracket in eager forwards (us, not in the total) | graph replays per step | eager forwards per step | "
        "one empty Python call after a site exit, off / on (us) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        aten = sum(p["aten_ops"] for name, p in r["ops"].items() if name != "bracket")
        work = sum(p["work_ops"] for name, p in r["ops"].items() if name != "bracket")
        lines.append(
            f"| {r['bs']} | {r['sub_forwards']} | {r['off_sites_us']} | {r['on_sites_us']} | {r['on_sample_us']} | "
            f"{r['on_total_us']} | {r['on_total_p90_us']} | **{r['added_us']}** | {aten:g} ({work:g}) | "
            f"{r['on_bracket_us']} | {_replays(r)} | {r.get('eager_forwards_per_step', '')} | "
            f"{r.get('off_python_call_us', '')} / {r.get('on_python_call_us', '')} |"
        )
    return "\n".join(lines)


def add_run_options(parser, steps: int = 200, warmup: int = 20) -> None:
    """The options of a benchmark that times decode steps of this module's engine (jitter_cost, oracle_cost)."""
    parser.add_argument("--steps", type=int, default=steps, help="timed decode steps per run")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here (and .md beside it)")


def start_engine(args, prefix: str):
    """The instrumented engine copy those benchmarks build their cases from (one thread on CPU)."""
    if args.device == "cpu":
        torch.set_num_threads(1)
    return timed_engine(prefix)


def save_results(out, device: str, graphs: bool, rows: list, table: str) -> None:
    """Print ``table``; with ``out``, write the rows and the run's machine and command as JSON there, and the
    table as markdown beside it (the benchmarks that drive this module's engine share this)."""
    print(table)
    if not out:
        return
    device_name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    meta = dict(device=device, device_name=device_name, torch=torch.__version__, command=" ".join(sys.argv),
                cuda_graphs=device == "cuda" and graphs, time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    out.with_suffix(".md").write_text(f"Machine: {device_name} ({device}), torch {torch.__version__}; "
                                      f"`{meta['command']}`\n\n{table}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--subs", type=int, nargs="+", default=[1, 3],
                        help="sub-forwards per decode step: 1 = plain decode, k > 1 = EAGLE with k draft forwards")
    parser.add_argument("--steps", type=int, default=500, help="timed decode steps per case")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here (and .md beside it)")
    parser.add_argument("--readback-interval", type=int, default=None,
                        help="the canary's kv_canary_readback_interval (KV_CANARY_READBACK_INTERVAL) for the runs")
    parser.add_argument("--disable-cuda-graph", action="store_true",
                        help="on CUDA, run every forward eagerly (the default replays decode, verify, draft chain "
                             "and draft-extend from CUDA graphs)")
    parser.add_argument("--sweep-interval", type=int, default=0,
                        help="kv_canary_sweep_interval for the runs (default 0: off, the runtime's default; the "
                             "demo sweeps every 2 steps)")
    parser.add_argument("--real-kv", choices=("none", "partial", "all"), default="partial",
                        help="kv_canary_real_kv for the canary-on runs (all: every layer's whole rows, a debug mode)")
    parser.add_argument("--no-token-check", action="store_true",
                        help="kv_canary_token_check=0: no sampler wrap (and no sampled-token check)")
    parser.add_argument("--no-absorb", action="store_true",
                        help="on CUDA, do not absorb the graph-submission wait before each timed site exit")
    parser.add_argument("--replay-emulation", action="store_true",
                        help="on the CPU: after init, each bracketed forward's canary Python does what a CUDA-graph "
                             "replay does on the host (nothing), so the sites take their GPU path")
    parser.add_argument("--interleave", type=int, default=0, metavar="N",
                        help="build the canary-off and -on engines first and time them in alternating blocks of N "
                             "steps (default 0: the off engine's steps, then the on engine's)")
    args = parser.parse_args(argv)
    if args.replay_emulation:
        if args.device != "cpu":
            parser.error("--replay-emulation is for the CPU (on CUDA the forwards replay real graphs)")
        global REPLAY_EMULATION
        REPLAY_EMULATION = True
    if args.readback_interval is not None:
        os.environ["KV_CANARY_READBACK_INTERVAL"] = str(args.readback_interval)
    if args.no_token_check:
        os.environ["KV_CANARY_TOKEN_CHECK"] = "0"
    if args.device == "cuda" and not args.no_absorb:
        # Not while a graph is being captured (the EAGLE draft chain's sites run inside its capture): a
        # stream query there is not permitted, and there is no graph launch to wait for.
        CLOCK.absorb = lambda: torch.cuda.is_current_stream_capturing() or torch.cuda.current_stream().query()
    if args.device == "cpu":
        torch.set_num_threads(1)
    module = timed_engine("canary-step-overhead-")
    rows = []
    for subs in args.subs:
        for bs in args.bs:
            row = run_case(module, bs, subs, args.steps, args.warmup, args.profile_steps, args.device,
                           graphs=not args.disable_cuda_graph, sweep_interval=args.sweep_interval,
                           real_kv=args.real_kv, interleave=args.interleave)
            rows.append(row)
            print(markdown([row]).splitlines()[-1], flush=True)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    meta = dict(
        device=args.device, device_name=device_name, torch=torch.__version__, python=platform.python_version(),
        cores=os.cpu_count(), loadavg=os.getloadavg(), command=" ".join(sys.argv),
        cuda_graphs=args.device == "cuda" and not args.disable_cuda_graph,
        readback_interval=int(os.environ.get("KV_CANARY_READBACK_INTERVAL", CanarySettings.readback_interval)),
        absorbed=CLOCK.absorb is not None,
        sweep_interval=args.sweep_interval, token_check=not args.no_token_check, real_kv=args.real_kv,
        interleave=args.interleave,
        time=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    table = markdown(rows)
    print(table)
    for r in rows:
        for phase, ops in r["ops"].items():
            print(f"bs={r['bs']} subs={r['sub_forwards']} {phase}: {ops['by_name']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        args.out.with_suffix(".md").write_text(f"Machine: {device_name} ({args.device}), torch {torch.__version__}; "
                                               f"`{meta['command']}`\n\n{table}\n")


if __name__ == "__main__":
    main()
