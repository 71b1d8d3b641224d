"""Where the free note's host time goes on an EAGLE step: three ways of noting the rejected drafts' free, in-step.

The instrumented reference engine (CUDA graphs, EAGLE with 3 draft sub-forwards, canary on) runs decode
steps in alternating blocks of 50, each block noting the allocator's frees one way:

- ``copy_ at free``: as shipped (request_side.py): the slots copied into a kept view of the freed-slot buffer;
- ``driver at free``: the same copy issued as one ``cuMemcpyDtoDAsync`` through ctypes (no torch dispatch);
- ``copy at entry``: the free only noted (the tensor kept), copied at the next site's entry.

Per variant: the sites' and the note's host time per step (medians, us) by part, and the same two copies in
a warm loop for scale. Clean runs: the violations found are printed (must be 0).

    PYTHONPATH=$PWD python bench/runtime/probe_free_note.py --bs 64 256
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import step_overhead as so  # noqa: E402
from canary_instrument.runtime import request_side as rs  # noqa: E402

SHIPPED_FREE = rs.RequestSide.on_free
SHIPPED_APPLY = rs.RequestSide.apply


class Variants:
    """The three notes, each adding its host seconds to ``spent`` (per step)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self.memcpy = lib.cuMemcpyDtoDAsync_v2
        self.memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.memcpy.restype = ctypes.c_int
        self.spent = 0.0

    def copy_at_free(self, side, free_index):
        t0 = time.perf_counter()
        SHIPPED_FREE(side, free_index)
        self.spent += time.perf_counter() - t0

    def driver_at_free(self, side, free_index):
        t0 = time.perf_counter()
        n = free_index.numel()
        if (free_index.dtype is torch.int64 and free_index.is_cuda and free_index.is_contiguous()
                and side.offset + n <= side.state.freed.shape[0]):
            dst = side.state.freed.data_ptr() + 8 * side.offset
            stream = torch._C._cuda_getCurrentRawStream(free_index.get_device())
            if self.memcpy(dst, free_index.data_ptr(), 8 * n, stream):
                raise RuntimeError("cuMemcpyDtoDAsync failed")
            side.offset += n
            side.pending = True
        else:
            SHIPPED_FREE(side, free_index)
        self.spent += time.perf_counter() - t0

    def note_for_entry(self, side, free_index):
        t0 = time.perf_counter()
        side.__dict__.setdefault("later", []).append(free_index)
        side.pending = True
        self.spent += time.perf_counter() - t0


def apply_with_later(side):
    """The site entry's apply, copying first what ``note_for_entry`` kept (timed in the site's entry)."""
    later = side.__dict__.get("later")
    if later:
        side.later = []
        for free_index in later:
            SHIPPED_FREE(side, free_index)
    SHIPPED_APPLY(side)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--blocks", type=int, default=6)
    args = parser.parse_args()
    variants = Variants()
    chosen = {"note": variants.copy_at_free}
    rs.RequestSide.apply = apply_with_later
    module = so.timed_engine("probe-free-note-")
    rs.RequestSide.on_free = lambda side, free_index: chosen["note"](side, free_index)  # this probe's timers only
    so.CLOCK.absorb = lambda: torch.cuda.is_current_stream_capturing() or torch.cuda.current_stream().query()
    ways = {"copy_ at free": variants.copy_at_free, "driver at free": variants.driver_at_free,
            "copy at entry": variants.note_for_entry}
    print(f"Machine: {torch.cuda.get_device_name()}, torch {torch.__version__}; `{' '.join(sys.argv)}`\n")
    for bs in args.bs:
        case = so.Case(module, bs, 3, True, 20 + 50 * args.blocks * len(ways) + 20, "cuda")
        for _ in range(20):
            case.step()
        parts = {name: collections.defaultdict(list) for name in ways}
        for _ in range(args.blocks):
            for name, note in ways.items():
                chosen["note"] = note
                for _ in range(50):
                    variants.spent = 0.0
                    case.step()
                    for part, seconds in so.CLOCK.parts.items():
                        parts[name][part].append(seconds)
                    parts[name]["free note"].append(variants.spent)
                    parts[name]["sites + note"].append(so.CLOCK.sites + variants.spent)
        chosen["note"] = variants.copy_at_free
        found = [v for m in case.managers for v in m.flush()]
        side = next(m.steps.request_side for m in case.managers if m.steps.request_side is not None)
        print(f"bs {bs}: {len(found)} violations")
        for name, by_part in parts.items():
            print(f"  {name}: " + ", ".join(
                f"{part} {statistics.median(xs) * 1e6:.2f}" for part, xs in sorted(by_part.items())))
        index = torch.arange(1, 3 * bs + 1, device="cuda", dtype=torch.int64)
        for name in ("copy_ at free", "driver at free"):
            note = ways[name]
            samples = []
            for _ in range(2000):
                variants.spent = 0.0
                note(side, index)
                side.offset = 0
                samples.append(variants.spent)
            print(f"  warm loop, {name}: {statistics.median(samples) * 1e6:.2f}")
        torch.cuda.synchronize()
        del case


if __name__ == "__main__":
    main()
