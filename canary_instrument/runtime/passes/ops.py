"""Backend selection for the canary passes: Triton kernels on CUDA, the torch reference otherwise.

``KV_CANARY_BACKEND=torch|triton`` overrides both the caller's choice and the device default.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .state import CanaryState, PlanInputs

BACKENDS = ("torch", "triton")
ENV_BACKEND = "KV_CANARY_BACKEND"


class CanaryOps(Protocol):
    """Both backends produce identical rows, counters and ring records, byte for byte."""

    name: str

    def pre_forward(self, state: "CanaryState", plan: "PlanInputs", input_ids: "torch.Tensor") -> None:
        """If enabled: verify each real request's prefix in every group/half, then write its new rows."""

    def post_forward(self, state: "CanaryState", plan: "PlanInputs") -> None:
        """If enabled: verify the rows written this forward, then store their real-KV fingerprints."""

    def mark_freed(self, state: "CanaryState") -> None:
        """Mark the FULL rows of the slots in ``state.freed`` freed and empty it (``pre_forward`` does it first)."""


def resolve_backend(device, backend: Optional[str] = None) -> str:
    """The backend name that ``get_ops`` will use for ``device``."""
    env = os.environ.get(ENV_BACKEND, "").strip().lower()
    if env:
        if env not in BACKENDS:
            raise ValueError(f"{ENV_BACKEND}={env!r} is not a canary backend; use one of {', '.join(BACKENDS)}")
        return env
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not a canary backend; use one of {', '.join(BACKENDS)}")
        return backend
    return "triton" if str(device).startswith("cuda") else "torch"


def get_ops(device, backend: Optional[str] = None) -> CanaryOps:
    """The canary pass implementation for tensors on ``device``."""
    if resolve_backend(device, backend) == "triton":
        from .triton_ops import TritonCanaryOps

        return TritonCanaryOps()
    from .reference import TorchCanaryOps

    return TorchCanaryOps()
