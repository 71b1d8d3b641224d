"""The step state a manager shares with its sites and sub-forwards: one object of plain fields, owned by
the manager, that a site's entry and exit (``sites.py``) read and advance.
"""

from __future__ import annotations

from typing import Any

STEPS_REMEMBERED = 256  # steps whose post-forward totals label violations read late


class StepState:
    """One manager's phase and step counts."""

    __slots__ = ("open", "active", "init_finished", "forwards", "step", "planned", "totals",
                 "request_side", "token_oracle", "target", "labels")

    def __init__(self):
        self.open: Any = None  # the site whose with_ops_outside_graph() block is open
        self.active: Any = None  # the sub-forward manager whose bracketed forward runs now
        self.init_finished = False
        self.forwards = 0  # outside contexts completed, warm-up included (the enable warning counts them)
        self.step = 0
        self.planned = 0  # enabled sub-forward plans since init finished
        # Post-forward passes planned by the end of step s, at s % STEPS_REMEMBERED, for the last steps:
        # label the violations a published word reveals (one list store per step, nothing made).
        self.totals: list = [0] * STEPS_REMEMBERED
        # Req-pool allocations and KV frees noted by the allocator wrappers (request_side.py), and the token
        # oracle's noted rows (token_oracle.py): applied at the next forward site's entry, on its stream.
        self.request_side: Any = None
        self.token_oracle: Any = None
        # An EAGLE draft's: its target's StepState, and per step (at s % STEPS_REMEMBERED) the target's step when
        # it ended, so the draft's reports carry the target's step numbers (label()).
        self.target: Any = None
        self.labels: list = [0] * STEPS_REMEMBERED

    def end(self, planned: int) -> int:
        """Count a step whose forwards made ``planned`` sub-forward plans in all; returns its number."""
        self.step = step = self.step + 1
        self.planned = planned
        self.totals[step % STEPS_REMEMBERED] = planned
        if self.target is not None:
            self.labels[step % STEPS_REMEMBERED] = self.target.step
        return step

    def label(self, step: int) -> int:
        """The step number reports of ``step`` carry: the target's step it ran in, on an EAGLE draft whose
        target is known (a draft runs several forwards per target verify); else ``step`` itself."""
        if self.target is None or step <= self.step - STEPS_REMEMBERED:
            return step
        return self.labels[step % STEPS_REMEMBERED]

    def step_of_pass(self, post_runs: int) -> int:
        """The step whose forwards include post-forward pass number ``post_runs`` (the current step when
        it is older than the steps remembered or not counted yet)."""
        totals, step = self.totals, self.step
        for earlier in range(max(1, step - STEPS_REMEMBERED + 1), step + 1):
            if totals[earlier % STEPS_REMEMBERED] >= post_runs:
                return earlier
        return step
