"""A decode's pre pass beside its forward: on a second stream, forked before the model, joined before the post pass.

The pre pass (the freed-slot mark, then verify + write) of a forward that writes a fixed number of positions per
request (decode and target verify, ``PlanInputs.extend_const > 0``) reads only positions the forward does not
write (each request's prefix, and the slots' rows) and writes only canary state (rows, ring, counters, the freed
buffer), which the forward never reads. So it may run while the forward runs; the post pass, which checks the
rows the pre pass wrote, waits for it. At a small batch that takes the pre pass off the step's critical path:
its dependency chain, not its bandwidth, sets its time (docs/kernels.md, "A decode step at batch 1"). Inside a
CUDA graph capture the fork and the join are recorded as the graph's edges (torch's multi-stream capture), so a
replay runs them with no host work.

An extend keeps its pre pass in line: sglang may capture it piecewise (torch.compile), where a fork made in one
piece's graph cannot join in another's; so does any forward traced by torch.compile, and every forward off
CUDA (the torch reference has no streams). A pre pass that finds a violation reports it as in line: the
forward it ran beside reads what the pass read, since the forward writes none of it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager


class Beside:
    """One manager's second stream: ``fork`` runs a pre pass on it, ``join`` makes the forward's stream wait."""

    def __init__(self, device: Any):
        import torch

        self._stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None
        self._joins: Any = None  # the stream that forked and has not joined yet

    def fork(self, plan: Any) -> ContextManager:
        """A context in which the pre pass of ``plan``'s forward is enqueued: beside it, or in line."""
        if self._stream is None or plan.extend_const <= 0:
            return nullcontext()
        import torch

        if torch.compiler.is_compiling():
            return nullcontext()
        forward = torch.cuda.current_stream(self._stream.device)
        self._stream.wait_stream(forward)  # after everything enqueued before the model: the previous step too
        self._joins = forward
        return torch.cuda.stream(self._stream)

    def join(self) -> None:
        """Before the post pass: the forward's stream waits for the pre pass forked beside it, if any."""
        forward, self._joins = self._joins, None
        if forward is not None:
            forward.wait_stream(self._stream)
