"""One host-to-device upload per step: named regions of one device byte buffer, written on the host with numpy.

Everything the host sends in a step (plan control words, plan coefficients, expected-token
cells) is written into a pinned host buffer through numpy views, then sent with a single
non-blocking copy of the bytes in use. Device views of the regions have static addresses, so
a CUDA graph that reads them sees each step's values. The host buffer is double-buffered and
a buffer is reused only after the copy that read it has finished, so a non-blocking copy never
reads bytes the host is rewriting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ALIGN = 8


class Staging:
    """Regions are fixed at construction: ``{name: (numpy dtype, shape)}``, laid out in order."""

    def __init__(self, regions: dict[str, tuple[Any, tuple[int, ...]]], device: Any):
        import torch

        torch_dtypes = {"int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        layout: dict[str, tuple[int, int, np.dtype, tuple[int, ...]]] = {}
        offset = 0
        for name, (dtype, shape) in regions.items():
            dtype = np.dtype(dtype)
            if dtype.name not in torch_dtypes:
                raise ValueError(f"kv canary: staging region {name!r} has unsupported dtype {dtype.name}")
            offset = -(-offset // _ALIGN) * _ALIGN
            size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            layout[name] = (offset, size, dtype, tuple(shape))
            offset += size
        self.nbytes = -(-max(offset, 1) // _ALIGN) * _ALIGN
        self._offsets = {name: o for name, (o, _, _, _) in layout.items()}
        self._ends = {name: o + n for name, (o, n, _, _) in layout.items()}
        self.device_bytes = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._device_views = {
            name: self.device_bytes[o : o + n].view(torch_dtypes[d.name]).view(shape)
            for name, (o, n, d, shape) in layout.items()
        }
        self._host = [torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(2)]
        # Numpy views made once: building them per step costs more than the writes they serve.
        self._host_views = [
            {name: h.numpy()[o : o + n].view(d).reshape(shape) for name, (o, n, d, shape) in layout.items()}
            for h in self._host
        ]
        self._prefixes = BoundedCache()
        self._copied = [torch.cuda.Event() if self.cuda else None for _ in range(2)]
        self._copy_pending = [False, False]
        self._current = 0

    def offset(self, name: str) -> int:
        """Byte offset of region ``name``."""
        return self._offsets[name]

    def end(self, name: str) -> int:
        """Byte offset just past region ``name``."""
        return self._ends[name]

    def device_view(self, name: str) -> Any:
        """The region on the device, as a typed tensor view with a static address."""
        return self._device_views[name]

    def begin(self) -> None:
        """Switch to the other host buffer, waiting for the copy that last read it (long finished, normally)."""
        self._current ^= 1
        if self._copy_pending[self._current]:
            self._copied[self._current].synchronize()
            self._copy_pending[self._current] = False

    def host(self, name: str) -> np.ndarray:
        """Region ``name`` of the current host buffer, as a writable numpy view (valid until the next ``begin``)."""
        return self._host_views[self._current][name]

    def upload(self, nbytes: int) -> None:
        """Send the first ``nbytes`` of the current host buffer (one copy; non-blocking on CUDA)."""
        nbytes = -(-int(nbytes) // _ALIGN) * _ALIGN
        if not 0 < nbytes <= self.nbytes:
            raise ValueError(f"kv canary: staging upload of {nbytes} bytes; the buffer holds {self.nbytes}")
        prefix = self._prefixes.get(nbytes)
        if prefix is None:
            prefix = self._prefixes.put(nbytes, (self.device_bytes[:nbytes], [h[:nbytes] for h in self._host]))
        device, host = prefix
        device.copy_(host[self._current], non_blocking=self.cuda)
        if self.cuda:
            self._copied[self._current].record()
            self._copy_pending[self._current] = True


class BoundedCache(dict):
    """Tensor views keyed by size: slicing a tensor costs more host time than the copy it feeds,
    and the sizes seen repeat from step to step. Cleared when full, so odd sizes cannot pile up."""

    def __init__(self, limit: int = 256):
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
