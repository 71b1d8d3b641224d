"""Where the sampler wrap's host time goes, in place: a probe of step_overhead.py's engine.

The sampler wrap (`record_sampled`) costs tens of microseconds in a running engine with CUDA
graphs but a few outside it. This probe runs the instrumented reference engine (canary on, CUDA
graphs, decode) and, on alternate steps, times the record in two orders, right after the
engine's sampler returns:

- `record first`: an empty Python call, then the record, then a stream query (a CUDA call);
- `query first`: the stream query, then an empty Python call, then the record.

If the record is slow only when it comes before the first CUDA call after the graph launch, the
time is the driver's (the graph submission every next CUDA call waits for), not the record's.
A third column times the record's own torch metadata reads (the attributes, `data_ptr()`),
again after the query.

    PYTHONPATH=$PWD python bench/runtime/probe_sample.py --bs 8 64 256 --steps 300
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



def _nothing():
    return None


def probe(module, bs: int, steps: int) -> dict:
    case = Case(module, bs, 1, True, steps + 40, "cuda")
    manager = next(m for m in case.managers if m.state.token_offset == 0)
    record = manager.record_sampled  # step_overhead's timed wrapper around the real one
    stream = torch.cuda.current_stream()
    times = {"record first": [], "query after it": [], "query first": [], "record after query": [],
             "empty call first": [], "metadata reads after query": []}
    mode = [0]

    def probed(forward_batch, next_token_ids):
        p = time.perf_counter
        if mode[0] % 2 == 0:
            t0 = p()
            _nothing()
            t1 = p()
            record(forward_batch, next_token_ids)
            t2 = p()
            stream.query()
            t3 = p()
            times["empty call first"].append(t1 - t0)
            times["record first"].append(t2 - t1)
            times["query after it"].append(t3 - t2)
        else:
            t0 = p()
            stream.query()
            t1 = p()
            rows = forward_batch.req_pool_indices
            rows.data_ptr(), next_token_ids.data_ptr(), rows.shape[0], next_token_ids.dtype, next_token_ids.device
            t2 = p()
            record(forward_batch, next_token_ids)
            t3 = p()
            times["query first"].append(t1 - t0)
            times["metadata reads after query"].append(t2 - t1)
            times["record after query"].append(t3 - t2)
        mode[0] += 1

    manager.record_sampled = probed
    for _ in range(20):
        case.step()
    for _ in range(steps):
        case.step()
    return {k: round(statistics.median(v) * 1e6, 2) for k, v in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    module = timed_engine("canary-probe-")  # Case.step reads the sites' clock
    print(f"{torch.cuda.get_device_name()}; medians over {args.steps // 2} steps per order (us)")
    for bs in args.bs:
        print(f"bs {bs}: {probe(module, bs, args.steps)}", flush=True)


if __name__ == "__main__":
    main()
