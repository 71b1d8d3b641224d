"""What a trial injected: the step, what it corrupted, and the reasons that report it.

Below both the fault injectors (``faults.py``) and the HiCache trials (``hicache_trials.py``), which make one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Injection:
    step: int  # 1-based scheduler step during (batch hooks) or after (step_end) which the corruption happened
    description: str
    expected_reasons: frozenset
