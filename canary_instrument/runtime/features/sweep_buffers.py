"""What one idle-cache sweep launch reads and counts: the buffers the sweep (``sweep.py``) fills and both of
its backends (``sweep_reference.py``, ``sweep_triton.py``) read, in a module below all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Sweep counters (int64[3]), written by the kernel.
LAUNCHES, ROWS_SWEPT, ENTRIES_VERIFIED = 0, 1, 2


@dataclass
class SweepBuffers:
    """What one sweep launch reads and counts, all in device memory."""

    count: Any  # int64 [1]: rows to verify
    rows: Any  # int64 [capacity, 3]: slot, position, prev_slot (-1 = predecessor unknown)
    counters: Any  # int64 [3]: launches, rows swept, entries verified (rows x groups/halves checked)
