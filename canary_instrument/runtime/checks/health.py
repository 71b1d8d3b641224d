"""The health check: planned canary passes must have run by the time a snapshot shows them, and the
enable warning (``stats.EnableWarner``) while nothing has run at all."""

from __future__ import annotations

from typing import Any, Optional

from canary_instrument.runtime.errors import CanaryHealthError
from canary_instrument.runtime.reports.stats import EnableWarner


class HealthCheck:
    """Fed by each snapshot read; holds its verdict until the manager raises it at step end."""

    def __init__(self) -> None:
        self.unhealthy: Optional[str] = None
        self._warner: Optional[EnableWarner] = EnableWarner()

    @property
    def warning_done(self) -> bool:
        """The enable warning was given or can no longer be: nothing left to observe."""
        return self._warner is None

    def observe_warmup(self, forwards: int) -> None:
        """A forward before init finished (``forwards`` counts them since install)."""
        if self._warner is not None:
            self._warner.observe(forwards=forwards, init_finished=False)

    def check(self, tag: Any, pre_runs: int, post_runs: int) -> None:
        """The snapshot tagged ``tag`` counted ``pre_runs`` and ``post_runs``: every planned pass must have run."""
        if tag.planned and (pre_runs < tag.planned or post_runs < tag.planned) and self.unhealthy is None:
            self.unhealthy = (
                f"kv canary health check failed at step {tag.step}: {tag.planned} canary sub-forwards were planned "
                f"since init finished but the device counted {pre_runs} pre-forward and {post_runs} post-forward "
                "runs; a canary kernel stopped running (lost wiring, or a graph captured without the canary)"
            )

    def observe(self, tag: Any, pre_runs: int, post_runs: int, forwards: int) -> None:
        """The enable warning's view of the same snapshot (``forwards``: since install, warm-up included)."""
        warner = self._warner
        if warner is not None:
            warner.observe(forwards=forwards, init_finished=True, steps=tag.step, planned=tag.planned,
                           pre_runs=pre_runs, post_runs=post_runs)
            if warner.done:
                self._warner = None  # nothing left to warn about: no more calls

    def raise_if_unhealthy(self) -> None:
        if self.unhealthy is not None:
            message, self.unhealthy = self.unhealthy, None
            raise CanaryHealthError(message)
