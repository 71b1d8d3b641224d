"""Per-sub-forward plan inputs: static device buffers filled outside the graph from the real batch.

The kernels read sizes and the enable flag from device memory, so a captured CUDA graph
replays correctly with a different batch. Filling uses only device-to-device ops and one
host-to-device copy of the small control block (batch size, enable flags): no host sync.
"""

from __future__ import annotations

from typing import Any

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

    def is_(name: str) -> bool:
        check = getattr(mode, name, None)
        return bool(check()) if callable(check) else False

    if is_("is_idle") or int(getattr(forward_batch, "batch_size", 0) or 0) == 0:
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
    """The PlanInputs of every sub-forward, plus a host mirror of their control words."""

    def __init__(self, num_single_forward: int, max_bs: int, device: Any):
        import torch

        self.device = torch.device(device)
        self.max_bs = int(max_bs)
        # Column 0: num_reqs, column 1: enabled; one block so one copy updates every sub-forward.
        self.control = torch.zeros((num_single_forward, 2), dtype=torch.int32, device=self.device)
        self._mirror = torch.zeros((num_single_forward, 2), dtype=torch.int32)
        self.plans = [
            PlanInputs(
                num_reqs=self.control[i, 0:1],
                req_pool_indices=torch.zeros(self.max_bs, dtype=torch.int64, device=self.device),
                prefix_lens=torch.zeros(self.max_bs, dtype=torch.int32, device=self.device),
                extend_lens=torch.zeros(self.max_bs, dtype=torch.int32, device=self.device),
                enabled=self.control[i, 1:2],
            )
            for i in range(num_single_forward)
        ]

    def fill(self, index: int, forward_batch: Any, kind: str) -> int:
        """Write sub-forward ``index``'s plan for the real (unpadded) batch; returns its request count."""
        if kind == IDLE:
            self._mirror[index] = 0
            return 0
        bs = int(forward_batch.batch_size)
        if bs > self.max_bs:
            raise ValueError(f"kv canary: batch of {bs} requests exceeds the canary plan capacity {self.max_bs}")
        plan = self.plans[index]
        plan.req_pool_indices[:bs].copy_(forward_batch.req_pool_indices[:bs], non_blocking=True)
        if kind == DECODE:
            # Sub-forward i of a multi-step draft writes position seq_len - 1 + i.
            import torch

            torch.add(forward_batch.seq_lens[:bs], index - 1, out=plan.prefix_lens[:bs])
            plan.extend_lens[:bs].fill_(1)
        elif kind == TARGET_VERIFY:
            plan.prefix_lens[:bs].copy_(forward_batch.seq_lens[:bs], non_blocking=True)
            plan.extend_lens[:bs].fill_(draft_token_count(forward_batch))
        else:
            plan.prefix_lens[:bs].copy_(forward_batch.extend_prefix_lens[:bs], non_blocking=True)
            plan.extend_lens[:bs].copy_(forward_batch.extend_seq_lens[:bs], non_blocking=True)
        self._mirror[index, 0] = bs
        self._mirror[index, 1] = 1
        return bs

    def disable(self, index: int) -> None:
        self._mirror[index] = 0

    def upload(self) -> None:
        """Send the control words to the device (pinned + non_blocking on CUDA; no host sync)."""
        if self.device.type == "cuda":
            self.control.copy_(_to_pinned(self._mirror), non_blocking=True)
        else:
            self.control.copy_(self._mirror)


def _to_pinned(host_tensor: Any) -> Any:
    """A pinned copy: torch's caching host allocator keeps it alive until the async copy is done."""
    return host_tensor.pin_memory()


def to_device_async(host_tensor: Any, device: Any) -> Any:
    import torch

    if torch.device(device).type == "cpu":
        return host_tensor
    return _to_pinned(host_tensor).to(device, non_blocking=True)

