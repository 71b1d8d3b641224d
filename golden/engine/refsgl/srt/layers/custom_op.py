"""CustomOp: a layer with a plain-torch reference path and a Triton path, picked per call by device (sglang's pattern).

CUDA tensors take the Triton path, everything else the torch path, so CPU engines never import Triton.
`triton_everywhere()` sends every call down the Triton path (on CPU through TRITON_INTERPRET=1): for the
tests that hold one path against the other and for counting the CUDA path's ops without a GPU.
"""

from __future__ import annotations

import contextlib

from torch import nn

_triton_everywhere = False


@contextlib.contextmanager
def triton_everywhere():
    global _triton_everywhere
    before, _triton_everywhere = _triton_everywhere, True
    try:
        yield
    finally:
        _triton_everywhere = before


class CustomOp(nn.Module):
    """Subclasses define `forward_native` (torch; the reference) and `forward_triton`, with one signature whose
    first argument is a tensor on the device the op runs on."""

    def forward(self, *args, **kwargs):
        if _triton_everywhere or args[0].is_cuda:
            return self.forward_triton(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_triton(self, *args, **kwargs):
        raise NotImplementedError
