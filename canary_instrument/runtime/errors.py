"""Exceptions the canary runtime raises: real exceptions, never ``assert`` (which ``python -O`` removes)."""

from __future__ import annotations

from typing import Sequence


class CanaryError(RuntimeError):
    """Base class of every error the canary runtime raises on a serving path."""


class CanaryWiringError(CanaryError):
    """The wiring called the manager out of order (a lost, duplicated or nested canary context)."""


class CanaryHealthError(CanaryError):
    """A canary kernel that should have run after warm-up did not run: the wiring got lost."""


class CanaryViolationError(CanaryError):
    """Raise mode: one or more KV-cache violations; ``violations`` holds them all."""

    def __init__(self, violations: Sequence, extra_lines: Sequence[str] = ()):
        self.violations = list(violations)
        lines = [v.format() for v in self.violations] + list(extra_lines)
        super().__init__(f"{len(self.violations)} KV-canary violation(s):\n" + "\n".join(lines))
