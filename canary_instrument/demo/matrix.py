"""Run an instrumented engine clean and under injected faults, and judge every trial.

A trial starts from an idle engine with an empty cache, runs a random number of clean
steps (any violation there is a false alarm), arms one fault (most are the runtime's own
perturbations, run by the target's canary manager), and steps until the canary
reports a violation with one of the fault's expected reasons (caught) or a step budget
runs out (missed). Engines are built once per variant and reset between trials.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from canary_instrument.demo.faults import FAULTS, Fault
from canary_instrument.demo.injected import Injection
from canary_instrument.demo.workload import Workload

# Small enough for a 2-core CPU, big enough to exercise chunked prefill, prefix sharing,
# radix-cache eviction (768 slots for ~6 requests of up to ~120 tokens) and the SWA window.
ENGINE_DEFAULTS: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    max_running_requests=8,
    max_context_len=256,
    max_total_tokens=768,
    chunked_prefill_size=48,
    sliding_window_size=16,
    cuda_graph_max_bs=8,
    kv_canary="log",
    kv_canary_real_kv="partial",
    # The idle-cache sweep every other step: a flipped bit in a cached prefix is found before eviction reuses it.
    kv_canary_sweep_interval=2,
)

LAYOUTS = ("mha", "mla", "swa")


@dataclass(frozen=True)
class Variant:
    layout: str
    eagle: bool

    @property
    def label(self) -> str:
        return self.layout + ("+eagle" if self.eagle else "")


def all_variants(layouts=LAYOUTS) -> list[Variant]:
    return [Variant(layout, eagle) for layout in layouts for eagle in (False, True)]


@dataclass
class TrialResult:
    variant: Variant
    fault: str
    seed: int
    injection: Optional[Injection]
    detected_step: Optional[int] = None  # 1-based step whose flush returned the first matching violation
    reasons: frozenset = frozenset()
    example: Any = None  # the first matching Violation
    false_alarms: list = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.detected_step is not None and not self.false_alarms

    @property
    def delay(self) -> Optional[int]:
        """Steps between the corruption and its report (0 = the same step)."""
        if self.detected_step is None or self.injection is None:
            return None
        return self.detected_step - self.injection.step


@dataclass
class CleanResult:
    variant: Variant
    steps: int
    violations: list
    stats: Any
    seconds: float


class EngineBench:
    """One instrumented engine for one variant, reused across trials."""

    def __init__(self, engine_module, variant: Variant, environ: Optional[dict] = None, **overrides):
        args = dict(ENGINE_DEFAULTS, attention_layout=variant.layout, **overrides)
        if variant.eagle:
            args["speculative_algorithm"] = "EAGLE"
        self.variant = variant
        self._module, self._overrides, self._environ = engine_module, overrides, dict(environ or {})
        self._siblings: dict = {}  # (engine args, environ) of a fault -> the bench built with them
        with scoped_environ(self._environ):  # the canary reads its settings once, at install
            self.engine = engine_module.Engine(**args)
        self.managers = [m for m in (getattr(r, "canary_manager", None) for r in self.engine.model_runners) if m]
        if not self.managers:
            raise RuntimeError(
                "the engine has no canary manager: is it instrumented (canary-instrument apply) and kv_canary on?"
            )

    def flush(self) -> list:
        violations = []
        for manager in self.managers:
            violations.extend(manager.flush())
        return violations

    def reset(self):
        scheduler = self.engine.scheduler
        scheduler.abort_all_requests()
        scheduler.flush_cache()
        self.flush()  # whatever the previous trial's corruption still produced

    def step(self, workload: Workload) -> list:
        workload.step()
        return self.flush()

    def run_trial(self, fault: Fault, seed: int, warmup: tuple[int, int] = (3, 12), max_wait: int = 24) -> TrialResult:
        bench = self.bench_for(fault)
        if bench is not self:
            return bench.run_trial(fault, seed, warmup, max_wait)
        max_wait = max(max_wait, fault.max_wait or 0)
        rng = random.Random(seed)
        self.reset()
        workload = Workload(self.engine, rng)
        result = TrialResult(self.variant, fault.name, seed, None)
        for _ in range(rng.randint(*warmup)):
            result.false_alarms.extend(self.step(workload))
        armed = fault.arm(self.engine, rng)
        try:
            for _ in range(max_wait):
                violations = self.step(workload)
                armed.poll(violations)
                if armed.injection is None:
                    result.false_alarms.extend(violations)
                    continue
                result.injection = armed.injection
                matching = [v for v in violations if set(v.reasons) & armed.injection.expected_reasons]
                if matching:
                    result.detected_step = self.engine.scheduler.forward_ct
                    result.example = matching[0]
                    result.reasons = frozenset().union(*(v.reasons for v in violations))
                    break
        finally:
            armed.disarm()
        result.injection = armed.injection
        return result

    def fresh(self) -> "EngineBench":
        """A new engine with this bench's settings (an engine whose canary state no earlier run touched)."""
        return EngineBench(self._module, self.variant, environ=self._environ, **self._overrides)

    def bench_for(self, fault: Fault) -> "EngineBench":
        """This bench, or a sibling whose engine has the settings ``fault`` needs (built once)."""
        args, environ = dict(self._overrides, **dict(fault.engine_args)), dict(self._environ, **dict(fault.environ))
        if args == self._overrides and environ == self._environ:
            return self
        key = (fault.engine_args, fault.environ)
        if key not in self._siblings:
            self._siblings[key] = EngineBench(self._module, self.variant, environ=environ, **args)
        return self._siblings[key]

    def clean_run(self, steps: int, seed: int, workload_class=Workload) -> CleanResult:
        rng = random.Random(seed)
        self.reset()
        stats_before = _copy_stats(self.engine.scheduler.stats)
        workload = workload_class(self.engine, rng)
        violations = []
        start = time.perf_counter()
        for _ in range(steps):
            violations.extend(self.step(workload))
        seconds = time.perf_counter() - start
        return CleanResult(self.variant, steps, violations, _diff_stats(self.engine.scheduler.stats, stats_before), seconds)


@contextlib.contextmanager
def scoped_environ(values: dict):
    """Set environment variables for the block (the canary reads its settings once, at install)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _copy_stats(stats):
    return type(stats)(**vars(stats))


def _diff_stats(after, before):
    return type(after)(**{k: getattr(after, k) - getattr(before, k) for k in vars(after)})


def faults_for(variant: Variant, names=None) -> list[Fault]:
    names = list(FAULTS) if names is None else names
    return [FAULTS[n] for n in names if FAULTS[n].applies(variant.layout, variant.eagle)]


def quiet_canary_log():
    """The demo reports violations itself; keep log mode's per-violation lines off the terminal."""
    logging.getLogger("canary_instrument.runtime").setLevel(logging.CRITICAL)
