"""Decode-step time of the same workload with the canary off and on, measured side by side,
and the committed GPU figure (bench/engine/results/step_floor_*.json) to read it against."""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from canary_instrument.demo.matrix import ENGINE_DEFAULTS
from canary_instrument.demo.workload import Workload


@dataclass(frozen=True)
class Overhead:
    layout: str
    decode_steps: int
    off_ms: float  # median decode step, canary off
    on_ms: float  # median decode step, canary on (log mode, the configured real-KV mode)
    backend: str
    violations: int  # reported by the canary-on engine during the measurement (must be 0)
    device: str  # where the engine ran: "cpu" means the toy model's eager step, not a serving step

    @property
    def percent(self) -> float:
        return 100.0 * (self.on_ms - self.off_ms) / self.off_ms


def _decode_step_times(engine, workload: Workload, steps: int, warmup: int) -> tuple[list[float], int]:
    """Wall time of each decode step (device synchronised around it); the canary is read only at the end,
    as a serving loop would (it reads results one step late, without blocking)."""
    sync = _synchronizer(engine)
    times = []
    for i in range(warmup + steps):
        workload.top_up()
        sync()
        start = time.perf_counter()
        batch = engine.step()
        sync()
        if i >= warmup and batch is not None and batch.forward_mode.is_decode():
            times.append(time.perf_counter() - start)
    violations = 0
    for runner in engine.model_runners:
        manager = getattr(runner, "canary_manager", None)
        if manager is not None:
            violations += len(manager.flush())
    return times, violations


def _synchronizer(engine):
    import torch

    if torch.device(engine.model_runner.device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def measure_overhead(
    engine_module, layout: str, steps: int = 30, seed: int = 0, warmup: int = 6, rounds: int = 3,
    workload_shape=None, **overrides
) -> Overhead:
    """Run the same seeded workload on a canary-off and a canary-on engine; compare median decode steps.

    The engines alternate in rounds so a noisy neighbour on the machine hits both alike.
    """
    args = dict(ENGINE_DEFAULTS, attention_layout=layout, **overrides)
    engines = {"off": engine_module.Engine(**dict(args, kv_canary="none")),
               "on": engine_module.Engine(**dict(args, kv_canary="log"))}
    shape = {} if workload_shape is None else {"shape": workload_shape}
    workloads = {k: Workload(e, random.Random(seed), **shape) for k, e in engines.items()}
    times = {"off": [], "on": []}
    violations = 0
    for r in range(rounds):
        for key, engine in engines.items():
            step_times, found = _decode_step_times(engine, workloads[key], steps // rounds, warmup if r == 0 else 0)
            times[key] += step_times
            violations += found
    off_times, on_times = times["off"], times["on"]
    on = engines["on"]
    manager = on.model_runner.canary_manager
    backend = getattr(manager.ops, "name", type(manager.ops).__name__)
    return Overhead(
        layout=layout,
        decode_steps=len(on_times),
        off_ms=1000 * statistics.median(off_times),
        on_ms=1000 * statistics.median(on_times),
        backend=backend,
        violations=violations,
        device=str(on.model_runner.device),
    )


# The whole-step benchmark's committed result, in a source checkout (an installed package has no bench/).
COMMITTED_GPU_RESULT = Path(__file__).resolve().parents[2] / "bench" / "engine" / "results" / \
    "step_floor_nvidia_h200.json"


@dataclass(frozen=True)
class CommittedOverhead:
    """The committed whole-step figure: the canary's device + host time per Llama-3-8B decode step on a GPU,
    against that step's physical floor (bench/engine/step_floor.py, table (a))."""

    device: str
    page: str  # the results page beside the JSON
    rows: list  # (requests, context, canary device us, canary host us, floor us, % of the floor)

    def lines(self) -> list[str]:
        return [f"{b} x {c}: canary {dev + host:.0f} us per step (device {dev:.0f} + host {host:.0f}) = "
                f"{pct:.2f} % of the step's floor ({floor / 1000:.1f} ms)" for b, c, dev, host, floor, pct in self.rows]


def committed_gpu_overhead(path: Path = COMMITTED_GPU_RESULT) -> Optional[CommittedOverhead]:
    """The GPU figure committed under bench/engine/results, or None when it is not there."""
    try:
        data = json.loads(path.read_text())
        rows = [(r["requests"], r["context"], r["canary_device_us"], r["canary_host_us"], r["floor_us"],
                 r["total_percent_of_floor"]) for r in data["llama"]]
        return CommittedOverhead(device=data["device"], page=str(path.with_suffix(".md").name), rows=rows)
    except (OSError, ValueError, KeyError, TypeError):
        return None
