"""One sub-forward of a step (one model forward of a multi-step draft): its phase and its plan.

The bracketed ``model.forward`` runs its pre-ops (plan from the batch, then verify + write) and its
post-ops (verify + fingerprint) through the active sub-forward manager; once init has finished,
each checks that it runs in the phase the site left it in.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from canary_instrument.runtime.errors import CanaryWiringError
from canary_instrument.runtime.passes.ops import CanaryOps
from canary_instrument.runtime.step.beside import Beside
from canary_instrument.runtime.step.plan import plan_from_batch
from canary_instrument.runtime.passes.state import CanaryState, PlanInputs
from canary_instrument.runtime.step.steps import StepState

# Sub-forward phases.
IDLE, PLANNED, PRE_DONE, POST_DONE = "idle", "planned", "pre-ops done", "post-ops done"


class SingleForwardManager:
    """One sub-forward: its phase and its latest plan."""

    def __init__(self, index: int, *, steps: StepState, ops: CanaryOps, state: CanaryState, enabled: Any,
                 is_draft: bool, beside: Beside):
        self.index = index
        self._beside = beside
        self._steps = steps
        self.ops = ops
        self._state = state
        self._enabled = enabled
        self._draft = is_draft
        # One step of a multi-layer EAGLE chain (CanaryManager.mark_chain_step): checked where that is sound.
        self.chain = False
        self.phase = IDLE
        # The plan of the forward in flight (pre-ops to the post pass: at the logits or the post-ops); inside a
        # CUDA graph, the plan captured with the graph's static batch.
        self.plan: Optional[PlanInputs] = None

    def expect(self, allowed: tuple[str, ...], action: str) -> None:
        if self.phase not in allowed:
            raise CanaryWiringError(
                f"kv canary: {action} for sub-forward {self.index} while it is {self.phase!r}; "
                f"expected {' or '.join(repr(a) for a in allowed)} (is a canary context missing or duplicated?)"
            )

    def pre_ops_maybe_inside_graph(self, input_ids: Any, forward_batch: Any) -> None:
        steps = self._steps
        if steps.init_finished:
            self.expect((PLANNED,), "pre-ops inside the graph")
            self.phase = PRE_DONE
        self.plan = plan = plan_from_batch(forward_batch, self._enabled, index=self.index, draft=self._draft,
                                           chain=self.chain)
        if plan is not None:
            with self._beside.fork(plan):
                self.ops.pre_forward(self._state, plan, input_ids)
            if steps.token_oracle is not None:
                steps.token_oracle.check(plan, input_ids, forward_batch)

    def logits_ops_maybe_inside_graph(self) -> None:
        """At the model's logits: the post pass beside them, where the pre pass ran beside the forward (``beside.py``);
        once per forward."""
        if self.plan is None:
            return
        context = self._beside.fork_post()
        if context is None:
            return
        plan, self.plan = self.plan, None  # consumed here: the post-ops only join
        with context:
            self.ops.post_forward(self._state, plan)

    def post_ops_maybe_inside_graph(self) -> None:
        if self._steps.init_finished:
            self.expect((PRE_DONE,), "post-ops inside the graph")
            self.phase = POST_DONE
        plan, self.plan = self.plan, None
        self._beside.join()
        if plan is not None:
            self.ops.post_forward(self._state, plan)


def sub_forward(sfms: list, index: Any) -> SingleForwardManager:
    """Sub-forward manager ``index`` of ``sfms``, validated."""
    if not isinstance(index, int) or not 0 <= index < len(sfms):
        raise CanaryWiringError(
            f"kv canary: sub-forward index {index!r} out of range; this manager has "
            f"{len(sfms)} (max(1, speculative_num_steps - 1))"
        )
    return sfms[index]


def listed(sfms: list, indices: Optional[Iterable[int]]) -> list:
    """The sub-forward managers of a listing, validated (a site resolves its listing once)."""
    indices = [0] if indices is None else list(indices)
    found = [sub_forward(sfms, i) for i in indices]
    if len({s.index for s in found}) != len(found):
        raise ValueError(f"kv canary: duplicate sub-forward indices {indices}")
    return found
