"""The sampler wrap's record in place, two ways, on alternate steps of one running engine.

The instrumented reference engine (canary on, CUDA graphs, decode) runs; after the engine's sampler
returns, steps take turns: the record the runtime shipped before (one ``index_copy_`` of the tokens
into a per-req-pool-row table, by the batch's req_pool_indices), the shipped one
(``record_sampled``: one ``copy_`` into a cached view of the staging buffer, filed by the next
pre-forward pass), and an empty call. Interleaving puts both records on the same machine, engine
and step mix, which separate runs on lent machines do not (their spread is as large as the
difference). Steps that take the old way leave the staging buffer empty, so their forward checks
no token; nothing is reported either way.

    PYTHONPATH=$PWD python bench/runtime/probe_record.py --bs 8 64 256 --steps 300
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "runtime"))

import torch  # noqa: E402
from step_overhead import Case, timed_engine  # noqa: E402


WAYS = ("index_copy_ by row (before)", "copy_ into staging (shipped)", "empty call")


def probe(module, bs: int, steps: int, device: str) -> dict:
    case = Case(module, bs, 1, True, 3 * steps + 40, device)
    manager = next(m for m in case.managers if m.state.token_offset == 0)
    shipped = type(manager).record_sampled.__get__(manager)  # the real one, not step_overhead's timed wrapper
    table = torch.full((manager.state.req_to_token.shape[0],), -1, dtype=torch.int32, device=device)
    times = {way: [] for way in WAYS}
    turn = [0]

    def before(forward_batch, next_token_ids):
        # The record as it shipped before commit 0878778: CanaryManager.record_sampled's checks, then
        # expected_tokens.SampledTokens.record.
        if manager._sampled is None or not manager.init_finished or forward_batch is None:
            return
        rows = getattr(forward_batch, "req_pool_indices", None)
        shape = getattr(next_token_ids, "shape", None)
        if rows is None or shape is None or len(shape) != 1 or shape[0] != rows.shape[0]:
            return
        if next_token_ids.dtype is not table.dtype:
            next_token_ids = next_token_ids.to(table.dtype)
        if rows.dtype is not torch.int64:
            rows = rows.long()
        table.index_copy_(0, rows, next_token_ids)

    def probed(forward_batch, next_token_ids):
        way = WAYS[turn[0] % 3]
        t0 = time.perf_counter()
        if way == WAYS[0]:
            before(forward_batch, next_token_ids)
        elif way == WAYS[1]:
            shipped(forward_batch, next_token_ids)
        t1 = time.perf_counter()
        times[way].append(t1 - t0)
        turn[0] += 1

    manager.record_sampled = probed
    for _ in range(20):
        case.step()
    for way in times:
        times[way].clear()
    for _ in range(3 * steps):
        case.step()
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
