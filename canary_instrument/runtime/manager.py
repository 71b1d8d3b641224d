"""The canary manager of one model runner: it owns the phases of a step and hands each job to a part.

One forward step runs four phases, enforced in order once init has finished:

1. pre-ops outside the graph (a site's entry): phase bookkeeping only; nothing sent to the device.
2. pre-ops maybe inside the graph (bracketed ``model.forward``, before the model): the plan is
   taken from the forward batch's own device tensors (``plan.py``), then verify + write (a decode's
   beside the forward, on a second stream: ``beside.py``).
3. post-ops maybe inside (after the model): verify + fingerprint (and the sampled-token check); a decode's
   beside the model's logits, forked as the model computes them (``beside.py``).
4. post-ops outside (a site's exit): count the step, run what is due at step end (a perturbation
   of the idle cache, an idle-cache sweep slice, the SWA divergence counts), then read results with
   no device op: every post-forward pass publishes the status and one packed word into host-visible
   memory (``status.py``), read at every step end; the violation ring is fetched only when the
   count moved (the rare path). Every ``readback_interval`` steps, and on steps whose stats or SWA
   line is due, a tagged snapshot (one async copy and an event, read when complete, never waited
   for) feeds the health check, the stats line and the SWA line.

Before init has finished (warm-up, graph capture) the inside ops still launch, so capture records
them, but the device enable flag is 0 and they do nothing; those forwards are not steps.

An EAGLE draft whose worker wires no site and never ends its init (sglang's multi-layer EAGLE worker: one
draft runner per chain step, its forwards called bare or replayed from graphs) *follows its target*: the
target's step end drives it (``follower.py``: its init, its own forwards, its steps and what it reads).

The parts, and who calls whom: docs/architecture.md, "Runtime modules". The production features
hook in outside the graph: self-test perturbations (``perturb/``, target manager only) and the
idle-cache sweep (``sweep.py``) at step end.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional

from canary_instrument.runtime.errors import CanaryWiringError
from canary_instrument.runtime.checks.health import HealthCheck
from canary_instrument.runtime.passes.ops import CanaryOps
from canary_instrument.runtime.step.beside import Beside
from canary_instrument.runtime.step.follower import UNBOUNDED, Follower, drive
from canary_instrument.runtime.step.plan import IDLE as IDLE_BATCH
from canary_instrument.runtime.step.plan import forward_kind
from canary_instrument.runtime.reports.readback import DelayedReadback
from canary_instrument.runtime.reports.reporting import Reporter
from canary_instrument.runtime.setup.settings import CanarySettings
from canary_instrument.runtime.step.single_forward import IDLE, PLANNED, PRE_DONE, SingleForwardManager
from canary_instrument.runtime.reports.snapshots import Snapshots, Tag
from canary_instrument.runtime.reports.sink import open_sink
from canary_instrument.runtime.setup.sites import SITE_CONTEXT_TYPES, SiteCache, canary_context
from canary_instrument.runtime.passes.state import CanaryState
from canary_instrument.runtime.reports.stats import CanaryStats, StatsKeeper, StatsLine
from canary_instrument.runtime.passes.status import AT, SWA, SWEEP, PublishedWords, allocate_status
from canary_instrument.runtime.step.steps import StepState
from canary_instrument.runtime.reports.swa_divergence import swa_divergence_on_device
from canary_instrument.runtime.reports.violations import Violation


__all__ = ["CanaryManager", "CanaryStats", "SingleForwardManager"]


class _View(NamedTuple):
    """What the perturbation hooks read from the manager (``perturb.ManagerView``'s fields)."""

    step: int
    radix_cache: Any


def _on_steps(name: str, doc: str, writable: bool = True) -> property:
    """A manager attribute kept in its ``StepState``, where the sites read it."""

    def read(manager: "CanaryManager") -> Any:
        return getattr(manager.steps, name)

    def write(manager: "CanaryManager", value: Any) -> None:
        setattr(manager.steps, name, value)

    return property(read, write if writable else None, doc=doc)


class CanaryManager:
    """Owns one model runner's canary state and drives the kernels at the four phases of a step."""

    def __init__(
        self,
        *,
        settings: CanarySettings,
        state: CanaryState,
        ops: CanaryOps,
        device: Any,
        num_single_forward: int,
        sampled_tokens: Any = None,
        process_group: Any = None,
    ):
        import torch

        if num_single_forward < 1:
            raise ValueError(f"kv canary: num_single_forward must be >= 1, got {num_single_forward}")
        self.settings = settings
        self._ops = ops
        self.device = torch.device(device)
        # Read by every canary kernel: 0 until mark_init_finished(), so warm-up and capture write nothing.
        self.enabled = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._status = allocate_status(state, settings.ring_size, self.device)
        self._sampled = sampled_tokens
        if sampled_tokens is not None:
            state.sampled_tokens = sampled_tokens.table
            state.sample_staging, state.sample_rows = sampled_tokens.staging, sampled_tokens.rows
        self.state = state
        self.is_draft = state.token_offset == 1
        self.radix_cache: Any = None
        self.jitter: Any = None  # timing jitter (jitter.py), set by install_canary when switched on
        self.published = PublishedWords(state.published)
        self.steps = StepState()
        beside = Beside(self.device)  # sub-forwards run one after another: one second stream serves them all
        self.single_forward_managers = [
            SingleForwardManager(i, steps=self.steps, ops=ops, state=state, enabled=self.enabled,
                                 is_draft=self.is_draft, beside=beside)
            for i in range(num_single_forward)
        ]
        self._sites = SiteCache(self, self.steps, self.single_forward_managers)
        self.recent_sites = self._sites.recent  # read by sites.canary_context
        self._readback = DelayedReadback(self._status, state.ring)
        self.reporter = Reporter(
            mode=settings.mode, ring_size=settings.ring_size, readback=self._readback, published=self.published,
            lines_per_step=settings.lines_per_step,
            lines_per_interval=settings.lines_per_interval, summary_interval=settings.summary_interval,
            sink=open_sink(settings.violation_sink, process_group), line_format=settings.log_format,
        )
        self.health = HealthCheck()
        self._stats = StatsKeeper(interval=settings.stats_interval, rows_per_token=len(state.groups),
                                  swept_at=AT["sweep_rows"])
        self._snapshots = Snapshots(readback=self._readback, interval=settings.readback_interval, steps=self.steps,
                                    published=self.published, reporter=self.reporter, health=self.health,
                                    stats=self._stats, stats_line=self.stats_line)
        self._ranks = None
        if process_group is not None:
            from canary_instrument.runtime.checks.distributed import RankCheck, group_size

            if group_size(process_group) > 1:
                self._ranks = RankCheck(process_group, settings.dist_interval)
        # Settings are frozen: the per-step feature switches are read once, so a disabled one costs one compare.
        self._swa_interval = settings.swa_divergence_interval if state.layout == "swa" else 0
        self.sweeper = self._make_sweeper(settings, ops)
        # Self-test perturbations: the target's manager only (a draft worker's KV mirrors the target's slots).
        self.perturber = None
        if settings.perturb.enabled and not self.is_draft:
            from canary_instrument.runtime.perturb.perturber import make_perturber

            self.perturber = make_perturber(settings.perturb, state)
        # An EAGLE target's draft managers, sharing its req_to_token, in install order (install_canary links them;
        # a draft's own link is steps.target, its target's StepState).
        self.drafts: list = []
        self.is_chain_step = False  # one of several draft runners on its target (mark_chain_step)
        # An EAGLE draft's following of its target (step/follower.py; idle on a manager with no target).
        self.follower = Follower(self, self.steps, self.single_forward_managers[0])
        self._due = 0  # the next step whose end has more to do than read the published words (_next_due)

    def _make_sweeper(self, settings: CanarySettings, ops: CanaryOps) -> Any:
        if not settings.sweep_interval or self.is_draft:
            return None  # the target's sweep reads the slots both runners share; a draft has no cache of its own
        from canary_instrument.runtime.features.sweep import Sweeper

        backend = getattr(ops, "name", None)
        return Sweeper(self.state, interval=settings.sweep_interval, slots_per_sweep=settings.sweep_slots,
                       counters=self._status[SWEEP], backend=backend if backend in ("triton", "torch") else None)

    # ------------------------------------------------------------------ wiring surface

    @property
    def num_single_forward(self) -> int:
        return len(self.single_forward_managers)

    @property
    def ops(self) -> CanaryOps:
        """The canary passes' backend; replacing it (timing jitter wraps it) reaches every sub-forward."""
        return self._ops

    @ops.setter
    def ops(self, ops: CanaryOps) -> None:
        self._ops = ops
        for sfm in self.single_forward_managers:
            sfm.ops = ops

    step = _on_steps("step", "Steps counted since init finished.", writable=False)
    init_finished = _on_steps("init_finished", "Whether mark_init_finished() was called.", writable=False)
    request_side = _on_steps("request_side", "Req-pool allocations and KV frees noted by the allocator wrappers "
                             "(request_side.py), applied at the next forward site's entry.")
    token_oracle = _on_steps("token_oracle", "The token oracle (token_oracle.py, target only; None = off).")

    def mark_init_finished(self) -> None:
        """Warm-up and capture are over: from now on the kernels run and phase order is enforced."""
        steps = self.steps
        if steps.active is not None or steps.open is not None:
            raise CanaryWiringError("kv canary: mark_init_finished() called inside a canary context")
        if not steps.init_finished:
            self.enabled.fill_(1)
        steps.init_finished = True
        if self._sampled is not None:
            self._sampled.recording = True  # warm-up samples are not recorded

    def mark_chain_step(self) -> None:
        """This draft runner is one of several on its target: a step of a multi-layer EAGLE chain (install_canary
        says so when the second one installs, before any graph is captured). Its plans check only what is sound
        for such a chain (``plan._chain_step``)."""
        self.is_chain_step = True
        for sfm in self.single_forward_managers:
            sfm.chain = True

    def follow_target(self) -> None:
        """Let the target drive this EAGLE draft from now on: its worker never ended its init and need wire no
        site (sglang's multi-layer EAGLE worker calls each chain step's draft runner bare and replays its
        graphs). Called once the target has served a step; init ends here (``follower.Follower.start``)."""
        self.follower.start()

    @property
    def follows_target(self) -> bool:
        """Whether the target drives this draft (``follow_target``)."""
        return self.follower.following

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
        HiCache host tier, if it has one (runtime/features/hicache.py)."""
        from canary_instrument.runtime.features.hicache import attach_hicache

        self.radix_cache = tree_cache
        attach_hicache(self, tree_cache)

    def record_sampled(self, forward_batch: Any, next_token_ids: Any) -> None:
        """Stage each request's sampled token (``expected_tokens.SampledTokens.record``; the wrapped
        ``model_runner.sample`` calls that directly)."""
        if self._sampled is not None:
            self._sampled.record(forward_batch, next_token_ids)

    def with_active_single_forward_manager(self, index: int) -> Any:
        """Route the bracketed model forward inside this block to sub-forward ``index``."""
        return canary_context(self, None, active=index)

    def with_ops_outside_graph(
        self,
        single_forward_indices: Optional[Iterable[int]] = None,
        maybe_inaccurate_forward_batch: Any = None,
    ) -> Any:
        """Plan the listed sub-forwards before the block; read results and snapshot after it."""
        indices = [0] if single_forward_indices is None else single_forward_indices
        return canary_context(self, maybe_inaccurate_forward_batch, outside=indices)

    def site_context(self, forward_batch: Any = None, outside: Any = None, active: Optional[int] = None) -> Any:
        """One wired site's context: the outside-graph phases of the listed sub-forwards and/or the active
        sub-forward, in one reusable object per (listing, active) (``sites.SiteCache``)."""
        return self._sites.get(forward_batch, outside, active)

    # Called by the bracketed model.forward.
    def pre_ops_maybe_inside_graph(self, input_ids: Any, forward_batch: Any) -> None:
        sfm = self.steps.active
        if sfm is None:
            if self.follower.owns(forward_batch):  # a draft's forward that no site routed
                return self.follower.pre_ops(input_ids, forward_batch)
            return self._without_active("pre-ops")
        sfm.pre_ops_maybe_inside_graph(input_ids, forward_batch)

    def post_ops_maybe_inside_graph(self) -> None:
        sfm = self.steps.active
        if sfm is None:
            if self.follower.own is not None:
                return self.follower.post_ops()
            return self._without_active("post-ops")
        sfm.post_ops_maybe_inside_graph()

    def logits_ops_maybe_inside_graph(self) -> None:
        """Called as the model computes its logits: the post pass beside them, where it may run there."""
        sfm = self.steps.active or self.follower.own
        if sfm is not None:
            sfm.logits_ops_maybe_inside_graph()

    def _without_active(self, what: str) -> None:
        """A bracketed forward with no active sub-forward: warm-up and capture (nothing to do), else unwired."""
        if self.steps.init_finished:
            raise CanaryWiringError(
                f"kv canary: model forward ran {what} outside with_active_single_forward_manager(); "
                "this forward path is not wired"
            )

    # ------------------------------------------------------------------ results

    def flush(self) -> list[Violation]:
        """Block until every launched canary pass is read; return the violations read since the last flush.

        Log mode logs them as a step would; raise mode raises ``CanaryViolationError`` carrying them.
        """
        if self.steps.open is not None:
            raise CanaryWiringError("kv canary: flush() called inside with_ops_outside_graph()")
        self._drain(final=True)
        if self.perturber is not None:
            self.perturber.poll(wait=True)  # log every injection whose device facts are still on the way
        out = self.reporter.take_kept()
        self._raise_pending()
        return out

    def stats(self) -> CanaryStats:
        """Figures as of the last snapshot read (call ``flush()`` first for up-to-date ones)."""
        return self._stats.last(self.published.seen)

    def stats_line(self, tag: Optional[Tag] = None) -> StatsLine:
        """The ``kv_canary_stats=`` line of the last snapshot read (sweep progress as of ``tag``, else now)."""
        progress = tag.sweep_progress if tag is not None else None
        if progress is None and self.sweeper is not None:
            p = self.sweeper.progress
            progress = (p.passes, p.pass_rows)
        return self._stats.line(self.stats(), self.reporter.reasons.as_tuple(), progress, self.reporter.logged_total)

    # ------------------------------------------------------------------ phases (called by sites.Site)

    def pre_ops_outside_graph(self, sfms: list[SingleForwardManager], forward_batch: Any) -> int:
        """Phase bookkeeping only; returns how many sub-forwards this block plans (0 for an idle batch)."""
        if forward_batch is None:
            raise CanaryWiringError("kv canary: with_ops_outside_graph() needs the forward batch after init")
        for sfm in sfms:
            if sfm.phase is not IDLE:
                sfm.expect((IDLE,), "with_ops_outside_graph()")
        planned = 0 if forward_kind(forward_batch) == IDLE_BATCH else len(sfms)
        for sfm in sfms:
            sfm.phase = PLANNED
        if self.perturber is not None and planned:
            # The forward about to run is counted at its end: its violations carry step + 1.
            self.perturber.before_forward(_View(self.steps.step + 1, self.radix_cache), forward_batch)
        return planned

    def post_ops_outside_graph(self, sfms: list, planned: int, forward_batch: Any, ok: bool) -> None:
        """A site's block has ended (``ok``: cleanly): check the sub-forwards' phases, count the step, end it."""
        steps = self.steps
        steps.forwards += 1
        if not steps.init_finished:
            # Warm-up and capture forwards are not steps: nothing was planned, so there is
            # nothing to read, and the step schedule (stats, SWA, cross-rank checks) starts at
            # init on every rank, whatever warm-up each rank ran. A draft with a target ends its init by
            # itself once the target serves (sites.py): no warning that nobody called it.
            if steps.target is None:
                self.health.observe_warmup(steps.forwards)
            return
        perturber = self.perturber
        if perturber is not None:
            if planned and ok:
                perturber.after_forward(_View(steps.step + 1, self.radix_cache), forward_batch)
            else:
                perturber.restore()  # a failed forward: put back what was corrupted for it
        if sfms and sfms[0].phase is not IDLE:
            half_done = None
            for sfm in sfms:
                if sfm.phase is PRE_DONE:  # a wiring error: only then is the list built
                    half_done = [s.index for s in sfms if s.phase is PRE_DONE]
                    break
            for sfm in sfms:
                sfm.phase = IDLE
                sfm.plan = None
            if not ok:
                return
            if half_done:
                raise CanaryWiringError(f"kv canary: sub-forward(s) {half_done} ran pre-ops but never post-ops")
            steps.planned += planned
        if not ok:
            return
        steps.end(steps.planned)
        self.end_step(forward_batch)

    def end_step(self, forward_batch: Any) -> None:
        """Once per step, after its forwards were launched: device work that is due, then the readback. A step
        before ``_due`` with no perturbation armed only reads the published words; where they brought
        violations, it goes on as a due step would."""
        step = self.steps.step
        if step < self._due and self.perturber is None and not self._poll_published():
            if self.drafts:
                drive(self.drafts)
            return
        # The reporter counts in the steps reports carry: an EAGLE draft's are its target's (several draft
        # forwards a target step), so its summary interval is one of target steps.
        label = self.steps.label(step)
        if self.perturber is not None:
            self.perturber.at_step_end(_View(step, self.radix_cache))
        sweeper = self.sweeper
        stats_due = self._stats.interval != 0 and step % self._stats.interval == 0
        progress = None
        if sweeper is not None:
            if sweeper.maybe_sweep(step, self.radix_cache):
                self.reporter.note_sweep(label)
            if stats_due:
                p = sweeper.progress
                progress = (p.passes, p.pass_rows)
        swa_due = self._swa_interval != 0 and step % self._swa_interval == 0
        if swa_due:
            self._status[SWA].copy_(self._swa_on_device(forward_batch))
        snapshots = self._snapshots
        snapshots.read_ready()
        self._poll_published()
        self.reporter.end_step(label)
        snapshots.take_if_due(step, swa_due, stats_due, progress)
        ranks = self._ranks
        self._due = self._next_due(step)
        try:
            if ranks is None:
                self._raise_pending()
            elif step % ranks.interval == 0:
                last = self.stats()
                verdict = ranks.exchange(step, last.violations, self.health.unhealthy is not None, last.written)
                self._raise_pending()
                verdict.raise_if_bad(self.settings.mode == "raise")
        finally:
            if self.drafts:
                drive(self.drafts)

    def _next_due(self, step: int) -> int:
        """The next step whose end does more than read the published words: the next one while a snapshot is
        in flight, the reporter holds a summary interval open or a sweep runs; else the next snapshot, stats,
        SWA or cross-rank step. (A target's followers are driven at every step end either way.)"""
        if self._readback.pending() or self.reporter.interval_open or self.sweeper is not None:
            return step + 1
        interval = self._snapshots.interval
        due = step - step % interval + interval
        ranks = self._ranks.interval if self._ranks is not None else 0
        for interval in (self._stats.interval, self._swa_interval, ranks):
            if interval:
                due = min(due, step - step % interval + interval)
        return due

    # ------------------------------------------------------------------ reading results

    def _poll_published(self) -> bool:
        """Read the passes published since the last read; True when that brought violations."""
        return self.published.poll(UNBOUNDED if self.follower.following else self.steps.planned,
                                   self._read_published_count)

    def _read_published_count(self, count: int, post_runs: int) -> None:
        if self.follower.following:
            label = self.follower.label()  # a replayed graph's pass: the step is the target's (Follower.label)
        else:
            label = self.steps.label(self.steps.step_of_pass(post_runs))
        self.reporter.read(count, label, None)

    def _raise_pending(self) -> None:
        self.health.raise_if_unhealthy()
        self.reporter.raise_pending()

    def _drain(self, final: bool) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._snapshots.drain(final, self._poll_published)

    def _swa_on_device(self, forward_batch: Any) -> Any:
        seq_lens = None
        if forward_batch is not None and forward_kind(forward_batch) != IDLE_BATCH:
            seq_lens = forward_batch.seq_lens[: int(forward_batch.batch_size)]
        return swa_divergence_on_device(self.state.swa_mapping, seq_lens, self.state.swa_window)


SITE_CONTEXT_TYPES.add(CanaryManager)
