"""The SWA divergence reporter: how far the SWA group's view drifts from the FULL group's.

Per forward the kernels count verified entries of each group on device; every ``interval``
steps the reporter computes, on device, how many live slots the SWA allocator remapped and how
many tokens of the batch are out of the window, and the manager prints one
``kv_canary_swa_divergence=<json>`` line when that snapshot reaches the host (one step late).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

PREFIX = "kv_canary_swa_divergence="


@dataclass(frozen=True)
class SwaDivergenceLog:
    """One reporter line: cumulative verify counts and the divergence measured at ``forward_ct``."""

    forward_ct: int  # forward steps seen by the manager when the snapshot was taken
    verify_full: int  # FULL-group entries verified since start
    verify_swa: int  # SWA-group entries verified since start
    swa_full_idx_divergence: int  # mapped full slots whose SWA index differs from the full index
    swa_out_of_window_tokens: int  # tokens of that step's requests that lie before the window

    def format(self) -> str:
        return PREFIX + json.dumps(asdict(self), separators=(",", ":"), sort_keys=False)

    @classmethod
    def parse(cls, line: str) -> Optional["SwaDivergenceLog"]:
        """The record a log line carries, or None when the line has none; malformed -> ValueError."""
        at = line.find(PREFIX)
        if at < 0:
            return None
        payload = line[at + len(PREFIX) :].strip()
        try:
            data = json.JSONDecoder().raw_decode(payload)[0]
            return cls(**{f.name: int(data[f.name]) for f in fields(cls)})
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"malformed {PREFIX} line ({err}): {line!r}") from None

    @classmethod
    def find_last(cls, text: str) -> Optional["SwaDivergenceLog"]:
        """The last record in a log text (several lines), or None when there is none."""
        for line in reversed(text.splitlines()):
            record = cls.parse(line)
            if record is not None:
                return record
        return None


def swa_divergence_on_device(mapping: Any, seq_lens: Any, window: int) -> Any:
    """int64[2] device tensor (remapped live slots, out-of-window tokens); device work only."""
    import torch

    slots = torch.arange(mapping.shape[0], device=mapping.device, dtype=mapping.dtype)
    live = mapping[1:] != 0
    remapped = (live & (mapping[1:] != slots[1:])).sum()
    if seq_lens is None or window <= 0:
        out_of_window = torch.zeros((), dtype=torch.int64, device=mapping.device)
    else:
        out_of_window = (seq_lens.to(torch.int64) - window).clamp(min=0).sum()
    return torch.stack([remapped.to(torch.int64), out_of_window.to(torch.int64)])


def swa_log_from_status(step: int, values: Any) -> SwaDivergenceLog:
    """The reporter line of a status snapshot (``status.STATUS`` values) taken at ``step``."""
    from canary_instrument.runtime.passes.status import GROUP_VERIFIED, SWA

    verify_full, verify_swa = (int(v) for v in values[GROUP_VERIFIED])
    remapped, out_of_window = (int(v) for v in values[SWA])
    return SwaDivergenceLog(forward_ct=step, verify_full=verify_full, verify_swa=verify_swa,
                            swa_full_idx_divergence=remapped, swa_out_of_window_tokens=out_of_window)
