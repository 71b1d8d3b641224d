"""The sampler wrap's record in place, several ways, on alternate steps of one running engine.

The instrumented reference engine (canary on, CUDA graphs, decode) runs; after the engine's sampler
returns, steps take turns: the shipped record (``record_sampled``: the manager's checks, then one
``copy_`` into a cached view of the staging buffer, filed by the next pre-forward pass), the same
``copy_`` alone (no checks), the same copy issued straight to the CUDA driver
(``cuMemcpyDtoDAsync`` through ctypes on the current stream: no torch dispatch), and an empty
call. Every way but the empty call fills the staging buffer alike, so every step checks its
tokens and nothing is reported. Interleaving puts the ways on the same machine, engine and step
mix, which separate runs on lent machines do not (their spread is larger than the differences).
(Its first version, commit 0878778, compared the ``index_copy_`` by row the runtime shipped
before; its page is in git history.)

    PYTHONPATH=$PWD python bench/runtime/probe_record.py --bs 8 64 256 --steps 300
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "runtime"))

import torch  # noqa: E402
from step_overhead import Case, timed_engine  # noqa: E402


WAYS = ("record_sampled (shipped)", "copy_ alone", "driver memcpy", "empty call")


def _driver_memcpy():
    """``cuMemcpyDtoDAsync(dst, src, bytes, stream)`` of the CUDA driver the process already loaded."""
    fn = ctypes.CDLL("libcuda.so.1").cuMemcpyDtoDAsync_v2
    fn.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def probe(module, bs: int, steps: int, device: str) -> dict:
    case = Case(module, bs, 1, True, len(WAYS) * steps + 40, device)
    manager = next(m for m in case.managers if m.state.token_offset == 0)
    shipped = type(manager).record_sampled.__get__(manager)  # the real one, not step_overhead's timed wrapper
    staging = manager._sampled.staging
    view = staging[:bs]
    memcpy = _driver_memcpy()
    raw_stream = torch._C._cuda_getCurrentRawStream
    index = staging.device.index
    dst = staging.data_ptr()
    times = {way: [] for way in WAYS}
    turn = [0]

    def probed(forward_batch, next_token_ids):
        way = WAYS[turn[0] % len(WAYS)]
        t0 = time.perf_counter()
        if way == WAYS[0]:
            shipped(forward_batch, next_token_ids)
        elif way == WAYS[1]:
            view.copy_(next_token_ids)
        elif way == WAYS[2]:
            if memcpy(dst, next_token_ids.data_ptr(), bs * 4, raw_stream(index)):
                raise RuntimeError("cuMemcpyDtoDAsync failed")
        t1 = time.perf_counter()
        times[way].append(t1 - t0)
        turn[0] += 1

    manager.record_sampled = probed
    for _ in range(20):
        case.step()
    if staging.dtype != torch.int32:
        raise RuntimeError("expected an int32 staging buffer")
    for way in times:
        times[way].clear()
    for _ in range(len(WAYS) * steps):
        case.step()
    if manager.flush():
        raise RuntimeError("a way reported violations: it did not stage the tokens as the shipped record does")
    return {way: round(statistics.median(v) * 1e6, 2) for way, v in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per way")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    module = timed_engine("canary-probe-")  # Case.step reads the sites' clock
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{name}; host time of the record after the engine's sampler, medians over {args.steps} steps each (us)")
    for bs in args.bs:
        print(f"bs {bs}: {probe(module, bs, args.steps, args.device)}", flush=True)


if __name__ == "__main__":
    main()
