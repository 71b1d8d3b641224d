"""A stream race that only timing jitter reveals (GPU): the demo's jitter row and ``tests/runtime/test_jitter_race.py``.

The fault: each layer's KV write moved to a side stream that waits for the main stream (its K and V are
ready) while the main stream never waits for it before attention and the canary read the KV: the missing
``main.wait_stream(side)`` of real side-stream code (a KV store overlapped with compute, a cache load on a
copy stream). In a quiet engine the small write lands long before the post-forward pass fingerprints the
slot, so the race is latent: the canary sees nothing (nor, most of the time, does attention). With jitter
at the attention points (``runtime/features/jitter.py``) the write waits a random while on the side stream, the
post-forward pass fingerprints the stale bytes, and the next step's verify finds the fingerprint wrong. The
same fault with the wait in place stays clean under jitter, so the violations are the race's and not the
jitter's. It needs CUDA streams: on CPU there is no stream to race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

STEPS = 16
# Long enough that the side stream's delayed writes trail the host's launches of the reading passes even on a
# busy host (at 1 ms the race stayed hidden on one GPU machine while eight test processes shared its CPU).
JITTER_US = 20_000
JITTER_POINTS = "attn_before"
JITTER_SEED = 7
PROMPTS = [[(5 * i + j) % 100 + 1 for j in range(24 + 3 * i)] for i in range(8)]
# realkv=all: every layer's row is fingerprinted, so a stale read of any layer's KV write shows. Eager decode:
# the side-stream write is installed after the engine is built, so captured graphs would not run it.
ENGINE_ARGS = dict(attention_layout="mha", device="cuda", kv_canary="log", kv_canary_real_kv="all",
                   disable_cuda_graph=True)


def unavailable() -> Optional[str]:
    """Why the race cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "needs CUDA streams (no CUDA device here)"
    return None


def kv_write_on_a_side_stream(pool: Any, join: bool) -> None:
    """Run ``pool.set_kv_buffer`` (with its jitter points, when on) on a side stream; ``join`` is the fix."""
    import torch

    inner = pool.set_kv_buffer
    side = torch.cuda.Stream()

    def set_kv_buffer(*args, **kwargs):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                value.record_stream(side)  # the allocator must not hand K/V to the main stream meanwhile
        with torch.cuda.stream(side):
            inner(*args, **kwargs)
        if join:
            main.wait_stream(side)

    pool.set_kv_buffer = set_kv_buffer


def jitter_environ(jitter_us: int) -> dict:
    """The jitter settings of one run (0: off, whatever the environment said)."""
    if not jitter_us:
        return {"SGLANG_KV_CANARY_JITTER_MAX_US": "0"}
    return {"SGLANG_KV_CANARY_JITTER_MAX_US": str(jitter_us), "SGLANG_KV_CANARY_JITTER_POINTS": JITTER_POINTS,
            "SGLANG_KV_CANARY_JITTER_SEED": str(JITTER_SEED)}


@dataclass
class RaceRun:
    jitter_us: int
    join: bool
    manager: Any
    violations: list

    @property
    def reasons(self) -> set:
        return set().union(*(v.reasons for v in self.violations)) if self.violations else set()


def run_race(make_engine: Callable[[dict], tuple[Any, Any]], jitter_us: int, join: bool) -> RaceRun:
    """One run: ``make_engine(ENGINE_ARGS)`` builds an instrumented engine and returns (engine, canary manager),
    with jitter's settings already in the environment (the canary reads them at install)."""
    import torch

    engine, manager = make_engine(dict(ENGINE_ARGS))
    kv_write_on_a_side_stream(engine.model_runner.token_to_kv_pool, join=join)
    engine.generate(PROMPTS, max_new_tokens=STEPS)
    torch.cuda.synchronize()
    return RaceRun(jitter_us, join, manager, manager.flush())


def run_all(make_engine: Callable[[dict], tuple[Any, Any]]) -> list[RaceRun]:
    """The three runs the demo shows: no jitter, jitter, jitter with the wait restored."""
    from canary_instrument.demo.matrix import scoped_environ

    runs = []
    for jitter_us, join in ((0, False), (JITTER_US, False), (JITTER_US, True)):
        with scoped_environ(jitter_environ(jitter_us)):
            runs.append(run_race(make_engine, jitter_us, join))
    return runs


def as_expected(runs: list[RaceRun]) -> bool:
    quiet, jittered, joined = runs
    return not quiet.violations and "fingerprint" in jittered.reasons and not joined.violations
