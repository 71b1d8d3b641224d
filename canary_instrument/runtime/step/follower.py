"""An EAGLE draft that follows its target: its target's step ends drive it, since its own worker never does.

sglang's multi-layer EAGLE worker (one draft runner per chain step) wires no site on its draft runners and never
ends their init: a draft forward is the runner's bare ``forward`` or a replay of its graph, and no host call
reaches the draft's manager. So the target drives it (``drive``, at each target step end): once the target has
served a step, every graph is captured and the engine is serving, so the draft's init ends there; from then on a
bracketed forward outside any site plans itself as sub-forward 0, and each target step end counts a step of the
draft and reads what its passes published. What such a chain step checks: ``plan.py`` (``plan_from_batch``,
``chain``) and docs/runtime.md section 4.

Every manager has a ``Follower``; only a draft linked to a target (``steps.target``) ever plans its own forward
or follows.
"""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.step.single_forward import IDLE, PLANNED, SingleForwardManager
from canary_instrument.runtime.step.steps import STEPS_REMEMBERED, StepState

# A follower's published words are read with no planned bound: its graph replays plan on the device only.
UNBOUNDED = 1 << 62


class Follower:
    """One draft manager's following of its target, and the forward it plans itself when no site routed one."""

    __slots__ = ("_manager", "_steps", "_first", "following", "own", "_forwards", "_in_step")

    def __init__(self, manager: Any, steps: StepState, first: SingleForwardManager):
        self._manager = manager  # the draft's CanaryManager: its init and its step end
        self._steps = steps
        self._first = first  # sub-forward 0, which a forward no site routed plans itself as
        self.following = False  # the target drives this draft (start)
        self.own: Optional[SingleForwardManager] = None  # the sub-forward of a self-planned forward in flight
        self._forwards = 0  # steps.forwards as of the last follow step
        self._in_step = False  # inside step(): what is read ran before the target's step just counted

    def start(self) -> None:
        """Let the target drive this draft from now on (``CanaryManager.follow_target``): called once the target
        has served a step, so every graph is captured and the engine is serving; init ends here."""
        steps = self._steps
        if steps.target is None or self.following:
            return
        self.following = True
        if not steps.init_finished:
            self._manager.mark_init_finished()
        self._forwards = steps.forwards

    def step(self) -> None:
        """The target has ended a step: end one of this draft's, unless a site of its own ended one since the last
        (then that one read). Its reports carry the target step before the one just counted, whose forwards (a
        verify and the draft-extend after it) are the latest that can have published."""
        steps = self._steps
        if steps.open is not None or steps.active is not None:
            return
        if steps.forwards != self._forwards:
            self._forwards = steps.forwards
            return
        steps.forwards += 1
        self._forwards = steps.forwards
        step = steps.end(steps.planned)
        steps.labels[step % STEPS_REMEMBERED] = max(0, steps.target.step - 1)
        self._in_step = True
        try:
            self._manager.end_step(None)
        finally:
            self._in_step = False

    def label(self) -> int:
        """The step a published pass is reported in: the host does not know which step a replayed graph's pass ran
        in, so at a follow step the target step before the one just counted (the latest whose forwards can have
        published), else the target's step."""
        return self._steps.target.step - (1 if self._in_step else 0)

    def owns(self, forward_batch: Any) -> bool:
        """Whether a bracketed forward that no site routed is this draft's own to plan: before init, as a capture
        site would (a graph captured where the worker wires no capture site still records the passes, which do
        nothing until init); after it, on a follower (its worker calls the draft runner bare)."""
        steps = self._steps
        return steps.target is not None and steps.open is None and forward_batch is not None and (
            self.following or not steps.init_finished)

    def pre_ops(self, input_ids: Any, forward_batch: Any) -> None:
        """Plan the forward ``owns`` gave this draft as sub-forward 0, and run its pre-ops."""
        sfm = self._first
        sfm.phase = PLANNED  # also over what a failed forward left
        self.own = sfm
        sfm.pre_ops_maybe_inside_graph(input_ids, forward_batch)
        if sfm.plan is not None and self._steps.init_finished:
            self._steps.planned += 1

    def post_ops(self) -> None:
        """The own forward's post-ops; its sub-forward is idle again."""
        own, self.own = self.own, None
        own.post_ops_maybe_inside_graph()
        own.phase = IDLE


def drive(drafts: list) -> None:
    """At a target's step end: a draft whose worker never ended its init follows its target from now on, and every
    follower ends a step. A draft's raise comes after every follower was driven."""
    failure = None
    for draft in drafts:
        follower = draft.follower
        try:
            if not follower.following and not draft.init_finished:
                follower.start()
            elif follower.following:
                follower.step()
        except Exception as error:  # noqa: BLE001 - re-raised below, once every draft was driven
            failure = failure or error
    if failure is not None:
        raise failure
