"""Timing jitter: seeded random waits at fixed points of the forward, so races show up as violations.

A race between streams (a KV write on a side stream the reader does not wait for, a slot freed
while a forward in flight still reads it, an overlap scheduler's host work racing the device) is
usually hidden by the timing of a quiet engine. Jitter waits a random 0..max_us microseconds at
the points of ``settings.JITTER_POINTS``: before and after the canary's pre-forward and
post-forward passes (the ops the manager calls), and before and after each layer's KV write
(the KV pool's ``set_kv_buffer``, where attention starts). The wait runs on the stream that is
current at the point, so a side stream's KV write is delayed as much as the main stream's passes.

Device (CUDA): one launch of the rendered ``jitter_wait`` kernel per point, spinning on the GPU
timer. The wait length is drawn on the device from (seed, the point's launch count kept in device
memory, point id), so launches captured in a CUDA graph draw fresh waits on every replay with no
host work, and a seed repeats the same waits in the same order of launches. CPU: the same draws
from the same counters, slept on the host, which perturbs host threads (an overlap scheduler);
there is no device stream to delay. Under Triton's interpreter (the triton backend on CPU) the
kernel draws and counts but cannot wait. Before ``mark_init_finished`` (warm-up, capture) nothing
is drawn or waited, as the canary passes do nothing then.

Off (``jitter_max_us`` = 0, the default) nothing here is imported or installed: the manager's ops
and the pool's ``set_kv_buffer`` stay the engine's own, so the forward runs no extra Python and
launches no kernel.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from canary_instrument.runtime.passes.hashing import GOLDEN, U64, mix64_int
from canary_instrument.runtime.setup.instance_wrap import remember, unbind
from canary_instrument.runtime.setup.settings import JITTER_POINTS, CanarySettings

logger = logging.getLogger("canary_instrument.runtime")

NUM_POINTS = len(JITTER_POINTS)
POINT_ID = {name: i for i, name in enumerate(JITTER_POINTS)}
COUNT, LAST, TOTAL = 0, 1, 2  # rows of the jitter state: launch counts, last draw (ns), total drawn (ns)
_MARK = "__kv_canary_jitter__"


def draw_ns(seed: int, count: int, point: int, max_ns: int) -> int:
    """The wait of launch ``count`` (0-based) of point ``point``: the spec the kernel is held to."""
    key = (count * GOLDEN + point + 1) & U64
    return mix64_int(mix64_int(key) ^ (seed & U64)) % (max_ns + 1)


def runner_seed(seed: int, is_draft: bool) -> int:
    """A draft runner's waits come from a seed of their own, so the two runners' waits are not equal."""
    return mix64_int(seed ^ GOLDEN) >> 1 if is_draft else seed


class Jitter:
    """The draws and waits of one manager's jitter points; ``state`` holds their counters."""

    def __init__(self, *, seed: int, max_us: int, enabled: Any, backend: str):
        import torch

        if backend not in ("triton", "host"):
            raise ValueError(f"kv canary jitter: backend must be 'triton' or 'host', got {backend!r}")
        self.seed = seed
        self.max_ns = max_us * 1000
        self.backend = backend
        self._enabled = enabled  # the manager's device flag: 0 until init has finished
        # int64 [3, NUM_POINTS]: on the device for the kernel, on the host for the host backend.
        self.state = torch.zeros((3, NUM_POINTS), dtype=torch.int64, device=enabled.device)
        self._kernel = None
        if backend == "triton":
            from canary_instrument.codegen.specs import jitter_spec
            from canary_instrument.runtime.passes.triton_ops import load_kernel_module

            clock = "globaltimer" if enabled.device.type == "cuda" else "none"
            self._kernel = load_kernel_module(jitter_spec(clock)).jitter_wait

    def wait(self, point: int) -> None:
        """Wait a drawn time at ``point`` (a ``POINT_ID`` value) on the current stream, or on the host."""
        if self._kernel is not None:
            self._kernel[(1,)](self.state, self._enabled, point, self.seed, self.max_ns, NUM_POINTS=NUM_POINTS,
                               num_warps=1)
            return
        if not int(self._enabled[0]):
            return
        state = self.state
        count = int(state[COUNT, point])
        wait = draw_ns(self.seed, count, point, self.max_ns)
        if wait:
            time.sleep(wait / 1e9)
        state[COUNT, point] = count + 1
        state[LAST, point] = wait
        state[TOTAL, point] += wait

    def counts(self) -> dict:
        """Launches per point name so far (reads device memory: not for the hot path)."""
        return dict(zip(JITTER_POINTS, self.state[COUNT].tolist()))

    def totals_us(self) -> dict:
        """Microseconds drawn per point name so far (reads device memory: not for the hot path)."""
        return {name: ns / 1000 for name, ns in zip(JITTER_POINTS, self.state[TOTAL].tolist())}


class JitteredOps:
    """The manager's canary ops with jitter points before and after each pass."""

    def __init__(self, ops: Any, jitter: Jitter, points: tuple):
        self.ops = ops
        self.name = getattr(ops, "name", None)
        self.jitter = jitter
        wanted = set(points)
        self._pre = [POINT_ID[p] if p in wanted else None for p in ("pre_before", "pre_after")]
        self._post = [POINT_ID[p] if p in wanted else None for p in ("post_before", "post_after")]

    def pre_forward(self, state: Any, plan: Any, input_ids: Any) -> None:
        before, after = self._pre
        if before is not None:
            self.jitter.wait(before)
        self.ops.pre_forward(state, plan, input_ids)
        if after is not None:
            self.jitter.wait(after)

    def post_forward(self, state: Any, plan: Any) -> None:
        before, after = self._post
        if before is not None:
            self.jitter.wait(before)
        self.ops.post_forward(state, plan)
        if after is not None:
            self.jitter.wait(after)

    def mark_freed(self, state: Any) -> None:
        self.ops.mark_freed(state)


def wrap_kv_write(pool: Any, jitter: Jitter, points: tuple) -> bool:
    """Put the attention points around ``pool.set_kv_buffer`` (on the instance); False when it has none."""
    original, owner = unbind(pool, "set_kv_buffer")
    if original is None:
        return False
    if getattr(original, _MARK, False):
        raise ValueError(f"kv canary: {type(pool).__qualname__}.set_kv_buffer already has jitter points")
    before = POINT_ID["attn_before"] if "attn_before" in points else None
    after = POINT_ID["attn_after"] if "attn_after" in points else None
    wait = jitter.wait

    def set_kv_buffer(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            wait(before)
        out = original(*args, **kwargs) if owner is None else original(owner(), *args, **kwargs)
        if after is not None:
            wait(after)
        return out

    setattr(set_kv_buffer, _MARK, True)
    remember(set_kv_buffer, original, owner)
    pool.set_kv_buffer = set_kv_buffer
    return True


def install_jitter(manager: Any, pool: Any, settings: CanarySettings) -> Optional[Jitter]:
    """Switch jitter on for ``manager`` (and its runner's KV ``pool``) when the settings ask for it."""
    if not settings.jitter_max_us:
        return None
    backend = "triton" if manager.device.type == "cuda" or getattr(manager.ops, "name", None) == "triton" else "host"
    jitter = Jitter(seed=runner_seed(settings.jitter_seed, manager.is_draft), max_us=settings.jitter_max_us,
                    enabled=manager.enabled, backend=backend)
    points = settings.jitter_points
    if any(p.startswith(("pre_", "post_")) for p in points):
        manager.ops = JitteredOps(manager.ops, jitter, points)
    if any(p.startswith("attn_") for p in points) and not wrap_kv_write(pool, jitter, points):
        logger.warning("kv canary jitter: %s has no set_kv_buffer; the attention points are off",
                       type(pool).__qualname__)
    logger.info("kv canary jitter on: max_us=%d seed=%d points=%s backend=%s", settings.jitter_max_us,
                settings.jitter_seed, ",".join(points), backend)
    return jitter
