"""The canary manager of one model runner, and its per-sub-forward managers.

One forward step runs four phases, enforced in order once init has finished:

1. pre-ops outside the graph (``with_ops_outside_graph`` entry): phase bookkeeping only;
   no device work, nothing sent to the device.
2. pre-ops maybe inside the graph (bracketed ``model.forward``, before the model): the plan is
   taken from the forward batch's own device tensors (``plan.py``), then verify + write.
3. post-ops maybe inside (after the model): verify + fingerprint (and the sampled-token check).
4. post-ops outside (``with_ops_outside_graph`` exit): count the step, run what is due at step
   end (a perturbation of the idle cache, an idle-cache sweep slice, the SWA divergence counts),
   then read results with no device op: every post-forward pass leaves the status vector in
   host-visible memory (``state.published``, pinned host memory on CUDA) and, in one 8-byte word,
   the pair (violations recorded, post-forward passes run); the host reads that word at every
   step end and fetches the violation ring only when the count moved (the rare path). Every
   ``readback_interval`` steps, and on steps whose stats or SWA line is due, a tagged snapshot
   (one async copy and an event, read when complete, never waited for) feeds the health check,
   the stats line and the SWA line.

Before init has finished (warm-up, graph capture) the inside ops still launch, so capture
records them, but the device enable flag is 0 and they do nothing; those forwards are not
steps. ``mark_init_finished`` sets the flag once.

The production features hook in outside the graph: self-test perturbations (``perturb/``, target
manager only) before the model forward (entering the outside context), after it (leaving it) and
at step end; the idle-cache sweep (``sweep.py``) at step end over the radix cache handed over by
``attach_radix_cache``; its counters live in ``STATUS``, so the step's one snapshot carries them.
The stats line and the enable warning (``stats.py``) are fed from the snapshots already read.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional

from canary_instrument.runtime.errors import CanaryHealthError, CanaryViolationError, CanaryWiringError
from canary_instrument.runtime.plan import IDLE, forward_kind, plan_from_batch
from canary_instrument.runtime.readback import DelayedReadback, Snapshot
from canary_instrument.runtime.settings import CanarySettings
from canary_instrument.runtime.state import KERNEL_SWEEP, CanaryState, PlanInputs
from canary_instrument.runtime.stats import EnableWarner, ReasonCounter, StatsLine
from canary_instrument.runtime.swa_divergence import SwaDivergenceLog, swa_divergence_on_device
from canary_instrument.runtime.violations import Violation
from canary_instrument.runtime.wiring import NULL_CONTEXT, SITE_CONTEXT_TYPES, canary_context

logger = logging.getLogger("canary_instrument.runtime")

# The status vector: every device counter the host reads, in one int64 buffer so that one copy
# snapshots it all. A new counter is a new name appended at the end.
STATUS = (
    "ring_count",  # violation records made (cumulative; the ring keeps the last RING of them)
    "pre_runs", "post_runs", "verified", "written",  # state.counters
    "verified_full", "verified_swa",  # state.group_verified
    "swa_remapped", "swa_out_of_window",  # SWA divergence, written when a report is due
    "sweep_launches", "sweep_rows", "sweep_entries",  # idle-cache sweep (sweep.py's counters)
)
_AT = {name: i for i, name in enumerate(STATUS)}
_RING_COUNT = slice(_AT["ring_count"], _AT["ring_count"] + 1)
_COUNTERS = slice(_AT["pre_runs"], _AT["written"] + 1)
_GROUP_VERIFIED = slice(_AT["verified_full"], _AT["verified_swa"] + 1)
_SWA = slice(_AT["swa_remapped"], _AT["swa_out_of_window"] + 1)
_SWEEP = slice(_AT["sweep_launches"], _AT["sweep_entries"] + 1)

# Sub-forward phases.
_IDLE, _PLANNED, _PRE_DONE, _POST_DONE = "idle", "planned", "pre-ops done", "post-ops done"

_MAX_KEPT_VIOLATIONS = 100_000  # violations kept for flush(); older ones only counted
_PACKED = len(STATUS)  # first packed (ring_count, post_runs) word of the published mirror
# Packed-word slots: pass number p publishes into slot p % _PUBLISH_SLOTS, so a host that reads a few
# steps late (or after a multi-step EAGLE draft) still finds every pass's word.
_PUBLISH_SLOTS = 64
_LOW32 = 0xFFFFFFFF
_STEPS_REMEMBERED = 256  # steps whose post-forward totals label violations read late


@dataclass(frozen=True)
class CanaryStats:
    """Cumulative figures as of the last snapshot the host has read."""

    steps: int  # forward steps (outside contexts completed after init finished)
    tokens_protected: int  # tokens whose KV now carries canary rows (written / rows per token)
    verified: int  # entries verified (all groups and halves)
    written: int  # canary rows written by pre-forward, summed over groups and halves
    pre_runs: int
    post_runs: int
    violations: int

    def format(self) -> str:
        return (
            f"kv_canary stats: steps={self.steps} tokens_protected={self.tokens_protected} "
            f"verified={self.verified} written={self.written} pre_runs={self.pre_runs} "
            f"post_runs={self.post_runs} violations={self.violations}"
        )


class _Tag(NamedTuple):
    """Host facts at snapshot time: step number, enabled sub-forwards planned so far, SWA report due,
    and the sweep's progress (passes, rows in the current pass) when a stats line is due."""

    step: int
    planned: int
    swa_due: bool
    sweep_progress: Optional[tuple] = None


class _View(NamedTuple):
    """What the perturbation hooks read from the manager (``perturb.ManagerView``'s fields)."""

    step: int
    radix_cache: Any


class SingleForwardManager:
    """One sub-forward (one model forward of a multi-step draft): its phase and its latest plan."""

    def __init__(self, index: int, manager: "CanaryManager"):
        self.index = index
        self._manager = manager
        self.phase = _IDLE
        # The plan of the forward in flight (pre-ops to post-ops); inside a CUDA graph, the plan
        # captured with the graph's static batch.
        self.plan: Optional[PlanInputs] = None

    def _expect(self, allowed: tuple[str, ...], action: str) -> None:
        if self.phase not in allowed:
            raise CanaryWiringError(
                f"kv canary: {action} for sub-forward {self.index} while it is {self.phase!r}; "
                f"expected {' or '.join(repr(a) for a in allowed)} (is a canary context missing or duplicated?)"
            )

    def pre_ops_maybe_inside_graph(self, input_ids: Any, forward_batch: Any) -> None:
        manager = self._manager
        if manager.init_finished:
            site = manager._open
            if self.phase is _IDLE and site is not None and site._inline and self in site._sfms:
                site._plan_phases()  # an eager forward inside an inline site: from here on, the general path
            self._expect((_PLANNED,), "pre-ops inside the graph")
            self.phase = _PRE_DONE
        self.plan = plan = plan_from_batch(forward_batch, manager.enabled, index=self.index, draft=manager.is_draft)
        if plan is not None:
            manager.ops.pre_forward(manager.state, plan, input_ids)
            if manager.token_oracle is not None:
                manager.token_oracle.check(plan, input_ids, forward_batch)

    def post_ops_maybe_inside_graph(self) -> None:
        manager = self._manager
        if manager.init_finished:
            self._expect((_PRE_DONE,), "post-ops inside the graph")
            self.phase = _POST_DONE
        plan, self.plan = self.plan, None
        if plan is not None:
            manager.ops.post_forward(manager.state, plan)


class CanaryManager:
    """Owns one model runner's canary state and drives the kernels at the four phases of a step."""

    def __init__(
        self,
        *,
        settings: CanarySettings,
        state: CanaryState,
        ops: Any,
        device: Any,
        num_single_forward: int,
        sampled_tokens: Any = None,
        process_group: Any = None,
    ):
        import torch

        if num_single_forward < 1:
            raise ValueError(f"kv canary: num_single_forward must be >= 1, got {num_single_forward}")
        self.settings = settings
        self.ops = ops
        self.device = torch.device(device)
        # Read by every canary kernel: 0 until mark_init_finished(), so warm-up and capture write nothing.
        self.enabled = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._status = torch.zeros(len(STATUS), dtype=torch.int64, device=self.device)
        state.ring = torch.zeros((settings.ring_size, 8), dtype=torch.int64, device=self.device)
        state.status = self._status
        state.ring_count = self._status[_RING_COUNT]
        state.counters = self._status[_COUNTERS]
        state.group_verified = self._status[_GROUP_VERIFIED]
        # The host-visible mirror the post-forward passes publish into: pinned host memory on CUDA
        # (the kernels store to it through its mapped address), read here with numpy, no torch op.
        cuda = self.device.type == "cuda"
        state.published = torch.zeros(len(STATUS) + _PUBLISH_SLOTS, dtype=torch.int64, pin_memory=cuda)
        state.publish_done = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._published = memoryview(state.published.numpy())  # indexing gives a Python int
        self._sampled = sampled_tokens
        if sampled_tokens is not None:
            state.sampled_tokens = sampled_tokens.table
            state.sample_staging, state.sample_rows = sampled_tokens.staging, sampled_tokens.rows
        self.state = state
        self.is_draft = state.token_offset == 1
        self.radix_cache: Any = None
        # Req-pool allocations and KV frees noted by the allocator wrappers (request_side.py); applied at
        # the next forward site's entry, on the forward's stream.
        self.request_side: Any = None
        self.jitter: Any = None  # timing jitter (jitter.py), set by install_canary when switched on
        # The token oracle (token_oracle.py, target only; None = off): its noted rows are applied at the same point.
        self.token_oracle: Any = None
        self.single_forward_managers = [SingleForwardManager(i, self) for i in range(num_single_forward)]
        self._readback = DelayedReadback(self._status, state.ring)
        # Post-forward passes planned by the end of step s, at s % _STEPS_REMEMBERED, for the last steps:
        # label the violations a published word reveals (one list store per step, nothing made).
        self._step_totals: list = [0] * _STEPS_REMEMBERED
        self._sweep_steps: deque = deque(maxlen=_STEPS_REMEMBERED)  # steps that launched a sweep slice
        self._sites: dict = {}  # (listing key, active) -> a reusable _Site
        self.recent_sites: dict = {}  # active (an int or None) -> the _Site it used last (wiring.canary_context)
        self._read_passes = 0  # post-forward passes whose published word has been read
        self._readback_interval = settings.readback_interval
        self._group = process_group
        self._world = 1
        if process_group is not None:
            from canary_instrument.runtime.distributed import group_size

            self._world = group_size(process_group)

        self.init_finished = False
        self._active: Optional[SingleForwardManager] = None
        self._open: Optional[_Site] = None  # the site whose with_ops_outside_graph() block is open
        self._step = 0
        self._step_end_due = 1  # the next step a quiet manager's inline site exit runs _step_end at
        self._planned = 0  # enabled sub-forward plans since init finished
        self._seen = 0  # ring records read so far
        self._unflushed: list[Violation] = []
        self._unflushed_dropped = 0
        self._pending_raise: list[Violation] = []
        self._pending_lines: list[str] = []
        self._unhealthy: Optional[str] = None
        self._last_stats: Optional[CanaryStats] = None
        self._last_values = None  # numpy copy of the last status snapshot read
        self._last_step = 0  # the step that snapshot belongs to
        self._stats_logged_step = 0  # flush() re-reads the current step; its line is logged once
        # Every written token gets one row per (group, half): 2 on MHA, 1 on MLA, 4 on SWA.
        self._rows_per_token = len(state.groups)
        self._violations_seen_by_ranks = 0
        # Settings are frozen: the per-step feature switches are read once, so a disabled one costs one compare.
        self._stats_interval = settings.stats_interval
        self._swa_interval = settings.swa_divergence_interval if state.layout == "swa" else 0
        self._reasons = ReasonCounter()
        self._enable_warner: Optional[EnableWarner] = EnableWarner()
        self._forwards = 0  # outside contexts completed, warm-up included (the enable warning counts them)
        self.sweeper = self._make_sweeper(settings, ops)
        # Self-test perturbations: the target's manager only (a draft worker's KV mirrors the target's slots).
        self.perturber = None
        if settings.perturb.enabled and not self.is_draft:
            from canary_instrument.runtime.perturb.perturber import make_perturber

            self.perturber = make_perturber(settings.perturb, state)
        # No production feature switched on and one rank: most steps then only read the published words.
        self._quiet = (self.perturber is None and self.sweeper is None and self._world == 1
                       and not self._stats_interval and not self._swa_interval)
        self._fast = False  # init finished and quiet: sites take their inline path (_Site)

    def _make_sweeper(self, settings: CanarySettings, ops: Any) -> Any:
        if not settings.sweep_interval or self.is_draft:
            return None  # the target's sweep reads the slots both runners share; a draft has no cache of its own
        from canary_instrument.runtime.sweep import Sweeper

        backend = getattr(ops, "name", None)
        return Sweeper(self.state, interval=settings.sweep_interval, slots_per_sweep=settings.sweep_slots,
                       counters=self._status[_SWEEP], backend=backend if backend in ("triton", "torch") else None)

    # ------------------------------------------------------------------ wiring surface

    @property
    def num_single_forward(self) -> int:
        return len(self.single_forward_managers)

    @property
    def step(self) -> int:
        return self._step

    def mark_init_finished(self) -> None:
        """Warm-up and capture are over: from now on the kernels run and phase order is enforced."""
        if self._active is not None or self._open is not None:
            raise CanaryWiringError("kv canary: mark_init_finished() called inside a canary context")
        if not self.init_finished:
            self.enabled.fill_(1)
        self.init_finished = True
        self._fast = self._quiet

    def per_forward_workspace_bytes(self) -> int:
        """Device bytes the per-forward passes use besides the canary rows: the enable flag, the
        status vector and its publish counter, the violation ring, the sampled-token, identity and freed-slot
        tables. Plans are read from the forward batch's own tensors, so the Triton passes allocate nothing
        per forward.
        (The published mirror is pinned host memory, not counted here.)"""
        state = self.state
        buffers = [self.enabled, self._status, state.publish_done, state.ring, state.sampled_tokens,
                   state.sample_staging, state.sample_rows, state.identity, state.freed]
        return sum(int(b.numel()) * b.element_size() for b in buffers if b is not None)

    def attach_radix_cache(self, tree_cache: Any) -> None:
        """Keep the engine's prefix cache (sglang's scheduler hands it over once it exists), and follow its
        HiCache host tier, if it has one (runtime/hicache.py)."""
        from canary_instrument.runtime.hicache import attach_hicache

        self.radix_cache = tree_cache
        attach_hicache(self, tree_cache)

    def record_sampled(self, forward_batch: Any, next_token_ids: Any) -> None:
        """After ``model_runner.sample``: stage each request's sampled token (one device copy; the next
        pre-forward pass files it under the request's req-pool row). Skipped before init (warm-up samples)
        and for outputs that are not one token per request of the batch the forward ran."""
        sampled = self._sampled
        if sampled is None or not self.init_finished:
            return
        # Plain attribute reads, no getattr with a default and no len() of a tensor (Tensor.__len__ is Python):
        # this runs after every sample with the host's caches cold, where each costs microseconds.
        try:
            shape = next_token_ids.shape
            if len(shape) != 1 or shape[0] != forward_batch.req_pool_indices.shape[0]:
                return
        except AttributeError:  # no batch, no rows, or not a tensor
            return
        view = sampled.views.get(shape[0])
        if view is None:
            view = sampled.view(shape[0])
            if view is None:
                return
        view.copy_(next_token_ids)  # the one device op; the next pre-forward pass files it

    def with_active_single_forward_manager(self, index: int) -> "_ActiveForward":
        """Route the bracketed model forward inside this block to sub-forward ``index``."""
        return canary_context(self, None, active=index)

    def with_ops_outside_graph(
        self,
        single_forward_indices: Optional[Iterable[int]] = None,
        maybe_inaccurate_forward_batch: Any = None,
    ) -> "_OutsideGraph":
        """Plan the listed sub-forwards before the block; read results and snapshot after it."""
        indices = [0] if single_forward_indices is None else single_forward_indices
        return canary_context(self, maybe_inaccurate_forward_batch, outside=indices)

    def site_context(self, forward_batch: Any = None, outside: Any = None, active: Optional[int] = None) -> Any:
        """One wired site's context: the outside-graph phases of the listed sub-forwards and/or the active
        sub-forward, in one reusable object per (listing, active), so a step builds nothing and enters one
        context, not two. ``wiring.canary_context`` (which the two contexts above go through too) reuses
        the site it finds in ``recent_sites`` first and calls this only when that one does not fit."""
        if outside is None and active is None:
            return NULL_CONTEXT
        if outside is not None and type(outside) not in (list, tuple, range):
            outside = list(outside)  # an iterator: read it once
        key = _site_key(outside, active)
        site = self._sites.get(key) if key is not None else None
        if site is None or site.busy:
            site = _Site(self, outside, active)
            if key is not None and key not in self._sites and len(self._sites) < 256:
                self._sites[key] = site
        if key is not None:
            self.recent_sites[active] = site
        site.batch = forward_batch
        return site

    def _listed(self, single_forward_indices: Optional[Iterable[int]]) -> list:
        """The sub-forward managers of a listing, validated (a site resolves its listing once)."""
        indices = [0] if single_forward_indices is None else list(single_forward_indices)
        sfms = [self._sub_forward(i) for i in indices]
        if len({s.index for s in sfms}) != len(sfms):
            raise ValueError(f"kv canary: duplicate sub-forward indices {indices}")
        return sfms

    # Called by the bracketed model.forward.
    def pre_ops_maybe_inside_graph(self, input_ids: Any, forward_batch: Any) -> None:
        sfm = self._active_or_none("pre-ops")
        if sfm is not None:
            sfm.pre_ops_maybe_inside_graph(input_ids, forward_batch)

    def post_ops_maybe_inside_graph(self) -> None:
        sfm = self._active_or_none("post-ops")
        if sfm is not None:
            sfm.post_ops_maybe_inside_graph()

    # ------------------------------------------------------------------ results

    def flush(self) -> list[Violation]:
        """Block until every launched canary pass is read; return the violations read since the last flush.

        Log mode logs them as a step would; raise mode raises ``CanaryViolationError`` carrying them.
        """
        if self._open is not None:
            raise CanaryWiringError("kv canary: flush() called inside with_ops_outside_graph()")
        self._drain(final=True)
        if self.perturber is not None:
            self.perturber.poll(wait=True)  # log every injection whose device facts are still on the way
        out, self._unflushed = self._unflushed, []
        if self._unflushed_dropped:
            logger.warning(
                "kv_canary flush: %d more violations were logged but not kept for flush() (limit %d)",
                self._unflushed_dropped, _MAX_KEPT_VIOLATIONS,
            )
        self._unflushed_dropped = 0
        self._raise_pending(local=True)
        return out

    def stats(self) -> CanaryStats:
        """Figures as of the last snapshot read (call ``flush()`` first for up-to-date ones)."""
        return self._last

    @property
    def _last(self) -> CanaryStats:
        if self._last_stats is None:
            if self._last_values is None:
                self._last_stats = CanaryStats(0, 0, 0, 0, 0, 0, self._seen)
            else:
                count, pre_runs, post_runs, verified, written = (int(v) for v in self._last_values[:5])
                # Violations read from the published words may be ahead of the snapshot.
                self._last_stats = CanaryStats(self._last_step, written // self._rows_per_token, verified, written,
                                               pre_runs, post_runs, max(count, self._seen))
        return self._last_stats

    # ------------------------------------------------------------------ phases

    def _sub_forward(self, index: int) -> SingleForwardManager:
        if not isinstance(index, int) or not 0 <= index < self.num_single_forward:
            raise CanaryWiringError(
                f"kv canary: sub-forward index {index!r} out of range; this manager has "
                f"{self.num_single_forward} (max(1, speculative_num_steps - 1))"
            )
        return self.single_forward_managers[index]

    def _active_or_none(self, what: str) -> Optional[SingleForwardManager]:
        if self._active is None and self.init_finished:
            raise CanaryWiringError(
                f"kv canary: model forward ran {what} outside with_active_single_forward_manager(); "
                "this forward path is not wired"
            )
        return self._active

    def _pre_ops_outside_graph(self, sfms: list[SingleForwardManager], forward_batch: Any) -> int:
        """Phase bookkeeping only; returns how many sub-forwards this block plans (0 for an idle batch)."""
        if forward_batch is None:
            raise CanaryWiringError("kv canary: with_ops_outside_graph() needs the forward batch after init")
        for sfm in sfms:
            if sfm.phase is not _IDLE:
                sfm._expect((_IDLE,), "with_ops_outside_graph()")
        planned = 0 if forward_kind(forward_batch) == IDLE else len(sfms)
        for sfm in sfms:
            sfm.phase = _PLANNED
        if self.perturber is not None and planned:
            # The forward about to run is counted at its end: its violations carry step + 1.
            self.perturber.before_forward(_View(self._step + 1, self.radix_cache), forward_batch)
        return planned

    def _post_ops_outside_graph(self, sfms, planned: int, forward_batch, ok: bool) -> None:
        self._forwards += 1
        if not self.init_finished:
            # Warm-up and capture forwards are not steps: nothing was planned, so there is
            # nothing to read, and the step schedule (stats, SWA, cross-rank checks) starts at
            # init on every rank, whatever warm-up each rank ran.
            if self._enable_warner is not None:
                self._enable_warner.observe(forwards=self._forwards, init_finished=False)
            return
        perturber = self.perturber
        if perturber is not None:
            if planned and ok:
                perturber.after_forward(_View(self._step + 1, self.radix_cache), forward_batch)
            else:
                perturber.restore()  # a failed forward: put back what was corrupted for it
        if sfms and sfms[0].phase is not _IDLE:
            half_done = None
            for sfm in sfms:
                if sfm.phase is _PRE_DONE:  # a wiring error: only then is the list built
                    half_done = [s.index for s in sfms if s.phase is _PRE_DONE]
                    break
            for sfm in sfms:
                sfm.phase = _IDLE
                sfm.plan = None
            if not ok:
                return
            if half_done:
                raise CanaryWiringError(f"kv canary: sub-forward(s) {half_done} ran pre-ops but never post-ops")
            self._planned += planned
        if not ok:
            return
        self._step = step = self._step + 1
        self._step_totals[step % _STEPS_REMEMBERED] = self._planned
        self._step_end(forward_batch)

    def _step_end(self, forward_batch: Any) -> None:
        """Once per step, after its forwards were launched: device work that is due, then the readback."""
        step = self._step
        if self.perturber is not None:
            self.perturber.at_step_end(_View(step, self.radix_cache))
        sweeper = self.sweeper
        stats_due = self._stats_interval != 0 and step % self._stats_interval == 0
        progress = None
        if sweeper is not None:
            if sweeper.maybe_sweep(step, self.radix_cache):
                self._sweep_steps.append(step)
            if stats_due:
                p = sweeper.progress
                progress = (p.passes, p.pass_rows)
        swa_due = self._swa_interval != 0 and step % self._swa_interval == 0
        if swa_due:
            self._status[_SWA].copy_(self._swa_on_device(forward_batch))
        readback = self._readback
        # Earlier steps' snapshots whose copies have completed (normally just the last one taken).
        while readback.pending():
            snapshot = readback.harvest()
            if snapshot is None:
                break
            self._process(snapshot)
        self._poll_published()
        # A tagged snapshot every `readback_interval` steps (a copy and an event record: CUDA calls),
        # and on steps whose SWA or stats line is due.
        if step % self._readback_interval == 0 or swa_due or stats_due:
            readback.take(_Tag(step, self._planned, swa_due, progress))
        self._schedule_step_end(step)
        self._after_step(step)

    def _schedule_step_end(self, step: int) -> None:
        """When an inline site exit must next run ``_step_end``: the next step if a snapshot is still in
        flight (it is harvested there), else the next snapshot step."""
        interval = self._readback_interval
        self._step_end_due = step + 1 if self._readback.pending() else step - step % interval + interval

    # ------------------------------------------------------------------ reading results

    def _poll_published(self) -> None:
        """Read the packed word of every post-forward pass published since the last read, in pass order;
        fetch the ring only where a pass's violation count moved (the rare path)."""
        published = self._published
        passes = self._read_passes
        while passes < self._planned:
            nxt = passes + 1
            word = published[_PACKED + nxt % _PUBLISH_SLOTS]
            # Both halves are the device's cumulative counts modulo 2**32.
            number = (word >> 32) & _LOW32
            behind = (number - nxt) & _LOW32
            if behind >= 1 << 31:
                break  # pass nxt has not published yet
            if behind:
                # Read too late: the slot holds a later pass (64 passes since the last read). Its count
                # covers the passes skipped; their violations get its step.
                nxt += behind
            passes = nxt
            ahead = ((word & _LOW32) - self._seen) & _LOW32
            if ahead and ahead < 1 << 31:  # a snapshot may have read further already
                self._read_violations(self._seen + ahead, self._step_of_forward(nxt), None)
        self._read_passes = passes

    def _step_of_forward(self, post_runs: int) -> int:
        """The step whose forwards include post-forward pass number ``post_runs`` (the current step when
        it is older than the steps remembered or not counted yet)."""
        totals, step = self._step_totals, self._step
        for earlier in range(max(1, step - _STEPS_REMEMBERED + 1), step + 1):
            if totals[earlier % _STEPS_REMEMBERED] >= post_runs:
                return earlier
        return step

    def _sweep_step_before(self, step: int) -> int:
        """The last step before ``step`` that launched a sweep slice: a sweep runs at the end of its
        step, so the first forward that can reveal its records is the next step's."""
        found = step
        for swept in self._sweep_steps:
            if swept >= step:
                break
            found = swept
        return found

    def _drain(self, final: bool) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        while self._readback.pending():
            self._process(self._readback.harvest(wait=True))
        self._poll_published()
        if final:
            self._readback.take(_Tag(self._step, self._planned, False))
            self._process(self._readback.harvest(wait=True))

    def _process(self, snapshot: Snapshot) -> None:
        values, tag = snapshot.values, snapshot.tag
        count = int(values[0])
        pre_runs, post_runs = int(values[1]), int(values[2])
        self._last_values = values.copy()
        self._last_step = tag.step
        self._last_stats = None
        if count > self._seen:
            self._read_violations(count, tag.step, snapshot)
        if tag.planned and (pre_runs < tag.planned or post_runs < tag.planned) and self._unhealthy is None:
            self._unhealthy = (
                f"kv canary health check failed at step {tag.step}: {tag.planned} canary sub-forwards were planned "
                f"since init finished but the device counted {pre_runs} pre-forward and {post_runs} post-forward "
                "runs; a canary kernel stopped running (lost wiring, or a graph captured without the canary)"
            )
        if tag.swa_due:
            group_verified = [int(v) for v in values[_GROUP_VERIFIED]]
            remapped, out_of_window = (int(v) for v in values[_SWA])
            logger.info(
                "%s",
                SwaDivergenceLog(
                    forward_ct=tag.step,
                    verify_full=group_verified[0],
                    verify_swa=group_verified[1],
                    swa_full_idx_divergence=remapped,
                    swa_out_of_window_tokens=out_of_window,
                ).format(),
            )
        warner = self._enable_warner
        if warner is not None:
            warner.observe(forwards=self._forwards, init_finished=True, steps=tag.step, planned=tag.planned,
                           pre_runs=pre_runs, post_runs=post_runs)
            if warner.done:
                self._enable_warner = None  # nothing left to warn about: no more calls
        interval = self._stats_interval
        if interval and tag.step // interval > self._stats_logged_step // interval:
            self._stats_logged_step = tag.step
            logger.info("%s", self.stats_line(tag).format())

    def _read_violations(self, count: int, step: int, snapshot: Optional[Snapshot]) -> None:
        """Decode ring records [seen, count) as violations of ``step`` (sweep records: of the sweep's step)."""
        ring = self._readback.read_ring(snapshot)
        ring_size = ring.shape[0]
        first = max(self._seen, count - ring_size)
        rows = [ring[i % ring_size].tolist() for i in range(first, count)]
        sweep_step = self._sweep_step_before(step) if snapshot is None and self._sweep_steps else step
        violations = [Violation.from_record(row, sweep_step if row[0] == KERNEL_SWEEP else step) for row in rows]
        dropped = first - self._seen
        self._seen = count
        self._last_stats = None
        self._report(violations, dropped, step)

    def stats_line(self, tag: Optional[_Tag] = None) -> StatsLine:
        """The ``kv_canary_stats=`` line of the last snapshot read (sweep progress as of ``tag``, else now)."""
        last = self._last
        values = self._last_values
        swept = int(values[_AT["sweep_rows"]]) if values is not None else 0
        progress = tag.sweep_progress if tag is not None else None
        if progress is None and self.sweeper is not None:
            p = self.sweeper.progress
            progress = (p.passes, p.pass_rows)
        passes, pass_rows = progress if progress is not None else (0, 0)
        return StatsLine(
            step=last.steps, tokens_protected=last.tokens_protected, verified=last.verified, written=last.written,
            pre_runs=last.pre_runs, post_runs=last.post_runs, violations=last.violations,
            reasons=self._reasons.as_tuple(), swept=swept, sweep_passes=passes, sweep_pass_rows=pass_rows,
        )

    def _report(self, violations: list[Violation], dropped: int, step: int) -> None:
        self._reasons.add(violations)
        extra = []
        if dropped:
            extra.append(
                f"kv_canary violations dropped: {dropped} records at step {step} exceeded the ring "
                f"(KV_CANARY_RING_SIZE={self.settings.ring_size})"
            )
        room = _MAX_KEPT_VIOLATIONS - len(self._unflushed)
        self._unflushed.extend(violations[: max(0, room)])
        self._unflushed_dropped += max(0, len(violations) - max(0, room))
        if self.settings.mode == "raise":
            self._pending_raise.extend(violations)
            self._pending_lines.extend(extra)
            return
        for v in violations:
            logger.error("%s", v.format())
        for line in extra:
            logger.error("%s", line)

    def _after_step(self, step: int) -> None:
        if self._world > 1:
            if step % self.settings.dist_interval == 0:
                self._combine_ranks(step)
            return
        self._raise_pending(local=True)

    def _raise_pending(self, local: bool) -> None:
        if self._unhealthy is not None:
            message, self._unhealthy = self._unhealthy, None
            raise CanaryHealthError(message)
        if self._pending_raise or self._pending_lines:
            violations, lines = self._pending_raise, self._pending_lines
            self._pending_raise, self._pending_lines = [], []
            raise CanaryViolationError(violations, lines)

    def _combine_ranks(self, step: int) -> None:
        """A collective at the same step on every rank; then every rank raises what any rank found."""
        import torch.distributed as dist

        from canary_instrument.runtime.distributed import combine

        reports = combine(self._group, self._last.violations, self._unhealthy is not None, self._last.written)
        total = sum(r.violations for r in reports)
        new_violations = total > self._violations_seen_by_ranks
        self._violations_seen_by_ranks = total
        sick = [r.rank for r in reports if r.unhealthy]
        if dist.get_rank() == min(r.rank for r in reports):
            logger.info(
                "kv_canary ranks: step=%d ranks=%d violations=%d written=%d unhealthy_ranks=%s",
                step, len(reports), total, sum(r.written for r in reports), sick,
            )
        self._raise_pending(local=True)
        if sick:
            raise CanaryHealthError(f"kv canary health check failed on rank(s) {sick} (combined at step {step})")
        if self.settings.mode == "raise" and new_violations:
            ranks = [r.rank for r in reports if r.violations > 0]
            raise CanaryViolationError([], [f"kv_canary violations on rank(s) {ranks}: {total} in all ranks"])

    # ------------------------------------------------------------------ SWA divergence

    def _swa_on_device(self, forward_batch: Any) -> Any:
        seq_lens = None
        if forward_batch is not None and forward_kind(forward_batch) != IDLE:
            seq_lens = forward_batch.seq_lens[: int(forward_batch.batch_size)]
        return swa_divergence_on_device(self.state.swa_mapping, seq_lens, self.state.swa_window)


SITE_CONTEXT_TYPES.add(CanaryManager)


def _site_key(outside: Any, active: Any) -> Any:
    """The cache key of a site, or None where validation depends on more than the values (``1.0``
    and ``True`` equal ``1`` as keys but are not sub-forward indices alike): int indices only."""
    if active is not None and type(active) is not int:
        return None
    if outside is None or type(outside) is range:
        return (outside, active)
    if all(type(i) is int for i in outside):
        return (tuple(outside), active)
    return None


class _Site:
    """A wired site's context: ``with_ops_outside_graph`` then ``with_active_single_forward_manager``,
    entered and left as the nested pair would be, with no objects made per step.

    On a quiet manager (init finished, no production feature on, one rank) the usual step takes an
    inline path: its entry and exit touch only this object and the manager's step counters, because
    they run once per step with the host's caches cold from the engine's own work, where every call,
    object and attribute read costs (bench/runtime/RESULTS.md). The sub-forwards' phases stay idle on
    that path; an eager forward inside the site plans them when its pre-ops run (``_plan_phases``),
    and the site is then left by the general path, which checks them.
    """

    __slots__ = ("_manager", "listing", "index", "_sfms", "_active_sfm", "_planned", "batch", "busy", "_inline",
                 "_ready", "_mode", "_mode_idle")

    def __init__(self, manager: CanaryManager, outside: Any, active: Optional[int]):
        self._manager = manager
        self.listing = None if outside is None else (outside if type(outside) in (list, range) else list(outside))
        self.index = active
        self._sfms: Optional[list] = None  # the listing's sub-forward managers, resolved on first entry
        self._active_sfm: Optional[SingleForwardManager] = None  # likewise for ``active``
        self._planned = 0
        self.batch: Any = None
        self.busy = False
        self._inline = False  # entered by the inline path, to be left by it
        self._ready = False  # a listing whose managers (and active one, if any) are resolved: may go inline
        self._mode: Any = None  # the last forward mode seen with a non-empty batch, and whether it is idle
        self._mode_idle = False

    def __enter__(self) -> Any:
        manager = self._manager
        side = manager.request_side
        if side is not None and side.pending and self.listing is not None:
            side.apply()  # before this forward, after every forward launched before the allocations and frees
        oracle = manager.token_oracle
        if oracle is not None and oracle.pending and self.listing is not None:
            oracle.apply()
        if self._ready and manager._fast and manager._open is None and manager._active is None:
            batch = self.batch
            try:  # plain attribute reads (getattr with a default is a call); a batch without them goes general
                mode, size = batch.forward_mode, batch.batch_size
            except AttributeError:
                mode = None
            if mode is not None:
                if mode is self._mode and size:
                    idle = self._mode_idle
                else:
                    idle = forward_kind(batch) == IDLE
                    if size:
                        self._mode, self._mode_idle = mode, idle
                self._planned = 0 if idle else len(self._sfms)
                manager._open = self
                manager._active = active = self._active_sfm
                self.busy = self._inline = True
                return active
        self._inline = False
        self.busy = True
        try:
            if self.listing is not None:
                if manager._open is not None:
                    raise CanaryWiringError("kv canary: with_ops_outside_graph() nested inside another one")
                sfms = self._sfms
                if sfms is None:
                    sfms = self._sfms = manager._listed(self.listing)
                manager._open = self
                try:
                    self._planned = manager._pre_ops_outside_graph(sfms, self.batch) if manager.init_finished else 0
                except BaseException:
                    manager._open = None
                    raise
            if self.index is None:
                self._ready = self._sfms is not None
                return None
            try:
                sfm = self._active_sfm
                if sfm is None:
                    sfm = self._active_sfm = manager._sub_forward(self.index)
                if manager._active is not None:
                    raise CanaryWiringError(
                        f"kv canary: with_active_single_forward_manager({self.index}) nested inside "
                        f"with_active_single_forward_manager({manager._active.index})"
                    )
            except BaseException as err:
                if self.listing is not None:
                    self._leave_outside(type(err))
                raise
            manager._active = sfm
            self._ready = self._sfms is not None
            return sfm
        except BaseException:
            self.busy = False
            self.batch = None
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        manager = self._manager
        if self._inline and exc_type is None:
            # ``_post_ops_outside_graph`` of a clean forward on a quiet manager: count the step, then read the
            # pass published since the last one (a snapshot step, or one after it, takes the whole step end).
            batch = self.batch
            self.busy = False
            self.batch = None
            manager._active = None
            manager._open = None
            manager._forwards += 1
            manager._step = step = manager._step + 1
            manager._planned = planned = manager._planned + self._planned
            manager._step_totals[step % _STEPS_REMEMBERED] = planned
            if step >= manager._step_end_due:
                manager._step_end(batch)
                return False
            nxt = manager._read_passes + 1
            before = planned - self._planned  # the passes of the forwards launched before this site's
            if nxt <= before:
                # The usual case, one read: the last of them has published (so have all before it, in
                # stream order) and the violation count it carries is the one already read.
                word = manager._published[_PACKED + before % _PUBLISH_SLOTS]
                if ((word >> 32) - before) & _LOW32 == 0 and (word - manager._seen) & _LOW32 == 0:
                    manager._read_passes = before
                    return False
            if nxt <= planned:
                word = manager._published[_PACKED + nxt % _PUBLISH_SLOTS]
                if ((word >> 32) - nxt) & _LOW32 < 1 << 31:
                    # The next pass (or, read 64 passes late, a later one) has published, with violations
                    # or ahead of the others: read pass by pass, and raise what they brought as
                    # ``_step_end`` would.
                    manager._poll_published()
                    manager._raise_pending(local=True)
            return False
        try:
            if self.index is not None:
                manager._active = None
            if self.listing is not None:
                try:
                    manager._post_ops_outside_graph(self._sfms, self._planned, self.batch, exc_type is None)
                finally:
                    manager._open = None
        finally:
            self.busy = False
            self.batch = None
        return False

    def _plan_phases(self) -> None:
        """Turn this inline-entered site into a generally entered one: its sub-forwards planned, as
        ``_pre_ops_outside_graph`` leaves them (an eager forward's pre-ops are about to check that)."""
        for sfm in self._sfms:
            sfm.phase = _PLANNED
        self._inline = False

    def _leave_outside(self, exc_type: Any) -> None:
        manager = self._manager
        try:
            manager._post_ops_outside_graph(self._sfms, self._planned, self.batch, exc_type is None)
        finally:
            manager._open = None
