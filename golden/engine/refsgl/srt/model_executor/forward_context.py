"""forward_context: scope one EAGLE draft step's attention metadata to that step's model call."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def forward_context(attn_backend, forward_batch, *, step: int):
    """Install decode metadata for draft step `step`; it cannot leak into the next step.

    A batch being captured into a CUDA graph comes with the metadata the graph runner planned for
    the whole chain (`forward_metadata_ready`); planning here would bake this capture's host reads
    into the graph.
    """
    if forward_batch.forward_metadata_ready:
        yield
        return
    attn_backend.init_forward_metadata(forward_batch, tokens_per_req=1)
    try:
        yield
    finally:
        attn_backend.forward_metadata = None
