"""A decode's passes beside its forward: on a second stream, the pre pass forked before the model, the post pass
forked at the model's logits, both joined when the model returns.

The pre pass (the freed-slot mark, then verify + write) of a forward that writes a fixed number of positions per
request (decode and target verify, ``PlanInputs.extend_const > 0``) reads only positions the forward does not
write (each request's prefix, and the slots' rows) and writes only canary state (rows, ring, counters, the freed
buffer), which the forward never reads. So it may run while the forward runs. The post pass fingerprints the KV the
forward wrote and checks the rows the pre pass wrote: it must follow every layer's KV write and the pre pass.
When the model computes its logits (sglang's ``LogitsProcessor``, after the last layer), every layer has written
its KV, and the logits read only the last hidden states; so the post pass is forked there, on the same second
stream (after the pre pass), beside the logits, and the forward's stream waits for both when the model returns. A
model that computes no logits there keeps the post pass in line, after the forward. At a small batch that takes
both passes off the step's critical path: their dependency chains, not their bandwidth, set their time
(docs/kernels.md, "A decode step at batch 1"). Inside a CUDA graph capture the forks and the join are recorded
as the graph's edges (torch's multi-stream capture), so a replay runs them with no host work.

An extend keeps both passes in line: sglang may capture it piecewise (torch.compile), where a fork made in one
piece's graph cannot join in another's; so does any forward traced by torch.compile, and every forward off
CUDA (the torch reference has no streams). A pre pass that finds a violation reports it as in line: the
forward it ran beside reads what the pass read, since the forward writes none of it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager, Optional


class Beside:
    """One manager's second stream: ``fork`` runs a pre pass on it, ``fork_post`` the post pass, ``join`` makes the
    forward's stream wait for both."""

    def __init__(self, device: Any):
        import torch

        self._stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None
        self._joins: Any = None  # the stream that forked and has not joined yet

    def fork(self, plan: Any) -> ContextManager:
        """A context in which the pre pass of ``plan``'s forward is enqueued: beside it, or in line."""
        self._joins = None  # a forward that raised before its join left nothing this one may join or fork after
        if self._stream is None or plan.extend_const <= 0:
            return nullcontext()
        import torch

        if torch.compiler.is_compiling():
            return nullcontext()
        forward = torch.cuda.current_stream(self._stream.device)
        self._stream.wait_stream(forward)  # after everything enqueued before the model: the previous step too
        self._joins = forward
        return torch.cuda.stream(self._stream)

    def fork_post(self) -> Optional[ContextManager]:
        """At the model's logits: a context in which the post pass is enqueued beside them, after every layer's KV
        write and after the pre pass; None where the pre pass did not run beside (the post pass stays in line)."""
        forward = self._joins
        if forward is None:
            return None
        import torch

        if torch.compiler.is_compiling():  # logits inside a compiled region: the post pass after the model
            return None
        self._stream.wait_stream(forward)
        return torch.cuda.stream(self._stream)

    def join(self) -> None:
        """When the model returns: the forward's stream waits for what was forked beside it, if anything."""
        forward, self._joins = self._joins, None
        if forward is not None:
            forward.wait_stream(self._stream)
