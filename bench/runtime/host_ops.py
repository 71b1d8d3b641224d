"""Host microseconds of the single CUDA calls the canary's host path can issue, each on its own.

What stands between the canary's per-step host work and the 30 us bar (docs/runtime.md, host
cost): a torch op costs the host several microseconds of dispatch and launch whatever its size.
Each call is timed alone (median of --calls), once right after the previous call and once right
after a CUDA-graph replay followed by an untimed stream query (the step_overhead harness's
absorbed graph-submission wait). CUDA only.

    PYTHONPATH=$PWD python bench/runtime/host_ops.py --out $OUT/host_ops.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch


def _graph(x):
    """A captured 4096^3 matmul: something for the device to be busy with."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x @ x  # warm-up outside capture (cuBLAS workspace)
        with torch.cuda.graph(graph):
            x @ x
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return graph


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", help="write the table (Markdown) here")
    args = parser.parse_args(argv)

    dev = "cuda"
    table = torch.full((4096,), -1, dtype=torch.int32, device=dev)
    rows = torch.randperm(4096, device=dev)[:64]
    tokens = torch.randint(0, 1000, (64,), dtype=torch.int32, device=dev)
    status = torch.zeros(64, dtype=torch.int64, device=dev)
    host = torch.zeros(64, dtype=torch.int64, pin_memory=True)
    event = torch.cuda.Event()
    stream = torch.cuda.current_stream()
    graph = _graph(torch.randn(4096, 4096, device=dev))

    calls = {
        "index_copy_ (the sampler wrap's record)": lambda: table.index_copy_(0, rows, tokens),
        "scatter_": lambda: table.scatter_(0, rows, tokens),
        "tensor[rows] = tokens": lambda: table.__setitem__(rows, tokens),
        "copy_ D2H into pinned, non_blocking (a status snapshot)": lambda: host.copy_(status, non_blocking=True),
        "Event.record(stream)": lambda: event.record(stream),
        "Event.query()": lambda: event.query(),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "torch._C._cuda_getCurrentStream": lambda: torch._C._cuda_getCurrentStream(0),
        "CUDAGraph.replay()": lambda: graph.replay(),
        "pinned tensor .numpy()[0]": lambda: host.numpy()[0],
    }
    lines = []
    for after_graph in (False, True):
        for name, call in calls.items():
            seconds = []
            for i in range(args.calls):
                if after_graph:
                    graph.replay()
                    stream.query()
                t0 = time.perf_counter()
                call()
                seconds.append(time.perf_counter() - t0)
                if i % 50 == 0:
                    torch.cuda.synchronize()  # keep the device from falling far behind
            torch.cuda.synchronize()
            line = f"| {name} | {'yes' if after_graph else 'no'} | {statistics.median(seconds) * 1e6:.2f} |"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        head = (
            f"Machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, Python {platform.python_version()}; "
            f"`python bench/runtime/host_ops.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
            f"| call | after a graph replay | host us (median of {args.calls}) |\n|---|---|---|\n"
        )
        with open(args.out, "w") as f:
            f.write(head + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
