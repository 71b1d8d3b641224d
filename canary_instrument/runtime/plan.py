"""Per-sub-forward plan inputs: static device buffers filled outside the graph from the real batch.

The kernels read sizes and the enable flag from device memory, so a captured CUDA graph
replays correctly with a different batch. Per step the host writes the control words (request
count, enable flag) and two coefficients per sub-forward into the runner's staging buffer
(one host-to-device copy for everything, ``staging.py``); the device then derives every listed
sub-forward's lengths from the batch's own tensors in one op, whatever their number. No host sync.
"""


from __future__ import annotations

from typing import Any

import numpy as np

from canary_instrument.runtime.staging import BoundedCache
from canary_instrument.runtime.state import PlanInputs

DECODE = "decode"
EXTEND = "extend"
TARGET_VERIFY = "target_verify"
IDLE = "idle"


def forward_kind(forward_batch: Any) -> str:
    """Which plan convention applies; target-verify first because sglang counts it as an extend."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        raise ValueError(f"kv canary: forward batch {type(forward_batch).__qualname__} has no forward_mode")
    if int(getattr(forward_batch, "batch_size", 0) or 0) == 0:
        return IDLE
    # Keyed by type too: IntEnum modes of different engines compare equal to each other's ints.
    key = (type(mode), mode)
    try:
        return _KINDS[key]
    except (KeyError, TypeError):  # not seen yet, or a mode that cannot be a dict key
        pass
    kind = _kind_of(mode)
    try:
        _KINDS[key] = kind
    except TypeError:
        pass
    return kind


_KINDS: dict = {}  # (mode type, mode) -> kind: the mode methods cost more host time than a lookup


def _kind_of(mode: Any) -> str:
    def is_(name: str) -> bool:
        check = getattr(mode, name, None)
        return bool(check()) if callable(check) else False

    if is_("is_idle"):
        return IDLE
    if is_("is_target_verify"):
        return TARGET_VERIFY
    if is_("is_draft_extend") or is_("is_extend"):
        return EXTEND
    if is_("is_decode"):
        return DECODE
    raise ValueError(f"kv canary: unsupported forward mode {mode!r}")


def draft_token_count(forward_batch: Any) -> int:
    """Draft tokens per request of a target-verify batch: declared by the batch, else tokens / requests."""
    count = getattr(forward_batch, "num_tokens_per_req", None)
    if count is None:
        count = getattr(getattr(forward_batch, "spec_info", None), "draft_token_num", None)
    if count is None:
        count = int(forward_batch.input_ids.shape[0]) // int(forward_batch.batch_size)
    return int(count)


class PlanBuffers:
    """The PlanInputs of every sub-forward; control words and coefficients live in the staging buffer."""

    def __init__(self, num_single_forward: int, max_bs: int, staging: Any):
        import torch

        self.staging = staging
        self.device = staging.device
        self.max_bs = int(max_bs)
        k = int(num_single_forward)
        self._k = k
        # int32 [6k]: control [k, 2] (num_reqs, enabled), then coefficients [2, 2, k]:
        # (scale, offset) x (prefix, extend), len = scale * seq_len + offset.
        plan = staging.device_view("plan")
        self.control = plan[: 2 * k].view(k, 2)
        coef = plan[2 * k :].view(2, 2, k)
        self._scale, self._offset = coef[0], coef[1]
        self._templates = BoundedCache()  # (runs, kind, bs, draft count) -> the plan region's host bytes
        # One outside context plans all its listed sub-forwards from one batch and disables them
        # at exit, so they can share one req-pool index buffer.
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.lens = torch.zeros((2, k, self.max_bs), dtype=torch.int32, device=self.device)
        self._decode_offsets = np.arange(k, dtype=np.int32) - 1
        self._views = BoundedCache()  # (runs, bs) -> the device views derive() writes through
        self.plans = [
            PlanInputs(
                num_reqs=self.control[i, 0:1],
                req_pool_indices=self.req_pool_indices,
                prefix_lens=self.lens[0, i],
                extend_lens=self.lens[1, i],
                enabled=self.control[i, 1:2],
            )
            for i in range(k)
        ]

    @staticmethod
    def regions(num_single_forward: int) -> dict:
        return {"plan": (np.int32, (6 * int(num_single_forward),))}

    def stage(self, runs: list[tuple[int, int]], forward_batch: Any, kind: str) -> int:
        """Write the plan region (control words and coefficients) for the sub-forwards in ``runs``
        (host only; ``runs`` are [lo, hi) index ranges, see ``index_runs``); returns the request count."""
        if kind == IDLE:
            return 0
        bs = int(forward_batch.batch_size)
        if bs > self.max_bs:
            raise ValueError(f"kv canary: batch of {bs} requests exceeds the canary plan capacity {self.max_bs}")
        count = draft_token_count(forward_batch) if kind == TARGET_VERIFY else 0
        key = (tuple(runs), kind, bs, count)
        template = self._templates.get(key)
        if template is None:
            template = self._templates.put(key, self._template(runs, kind, bs, count))
        self.staging.host("plan")[:] = template
        return bs

    def _template(self, runs: list[tuple[int, int]], kind: str, bs: int, count: int) -> np.ndarray:
        k = self._k
        region = np.zeros(6 * k, dtype=np.int32)
        control, coef = region[: 2 * k].reshape(k, 2), region[2 * k :].reshape(2, 2, k)
        for lo, hi in runs:
            control[lo:hi] = (bs, 1)
            coef[0, 0, lo:hi] = 1  # prefix = seq_len + offset
            if kind == DECODE:
                # Sub-forward i of a multi-step draft writes position seq_len - 1 + i.
                coef[1, 0, lo:hi] = self._decode_offsets[lo:hi]
                coef[1, 1, lo:hi] = 1
            elif kind == TARGET_VERIFY:
                coef[1, 1, lo:hi] = count
        return region

    def derive(self, runs: list[tuple[int, int]], forward_batch: Any, kind: str, bs: int) -> None:
        """Fill the listed sub-forwards' device buffers from the batch (after the staging upload)."""
        import torch

        if bs == 0:
            return
        views = self._views.get((tuple(runs), bs))
        if views is None:
            views = self._views.put((tuple(runs), bs), self._make_views(runs, bs))
        rpi, per_run = views
        rpi.copy_(_first(forward_batch.req_pool_indices, bs), non_blocking=True)
        if kind == EXTEND:
            prefix_src = _first(forward_batch.extend_prefix_lens, bs)
            extend_src = _first(forward_batch.extend_seq_lens, bs)
            for _, _, _, prefix, extend in per_run:
                prefix.copy_(prefix_src, non_blocking=True)
                extend.copy_(extend_src, non_blocking=True)
        else:
            seq_lens = _first(forward_batch.seq_lens, bs)
            for lens, offset, scale, _, _ in per_run:
                torch.addcmul(offset, seq_lens, scale, out=lens)

    def _make_views(self, runs: list[tuple[int, int]], bs: int) -> tuple:
        per_run = [
            (self.lens[:, lo:hi, :bs], self._offset[:, lo:hi, None], self._scale[:, lo:hi, None],
             self.lens[0, lo:hi, :bs], self.lens[1, lo:hi, :bs])
            for lo, hi in runs
        ]
        return self.req_pool_indices[:bs], per_run

    def disable_on_device(self) -> None:
        """Every sub-forward off (a device op; no host copy), before anything can replay without a fresh plan."""
        self.control.zero_()


def _first(tensor: Any, n: int) -> Any:
    """``tensor[:n]``, skipping the slice (host time) when the batch tensor is exactly that long."""
    return tensor if tensor.shape[0] == n else tensor[:n]


def index_runs(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive index runs as [lo, hi) pairs: one device op per run (one for range(k))."""
    runs: list[tuple[int, int]] = []
    for i in sorted(indices):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def to_device_async(host_tensor: Any, device: Any) -> Any:
    """A device copy of a host tensor; pinned and non-blocking on CUDA (torch's caching host
    allocator keeps the pinned copy alive until the copy is done)."""
    import torch

    if torch.device(device).type == "cpu":
        return host_tensor
    return host_tensor.pin_memory().to(device, non_blocking=True)
