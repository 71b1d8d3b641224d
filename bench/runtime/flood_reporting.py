"""Host time of the violation reporter under a flood: every step brings a full ring of new records.

    python bench/runtime/flood_reporting.py [--steps 3000] [--records 1024] [--dropped 3000]

Drives ``Reporter`` itself (reports/reporting.py) with synthetic ring records shaped like the real-server
flood's (``decode_table_shift``: pre-forward records of a few reasons over thousands of slots), logging to a
file as a server's handler would, and ends each step as the manager does (summaries included). Prints the
mean host time per step; the real server's cost under the same flood is bench/sglang_server's flood suite.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from canary_instrument.runtime.reports.reporting import Reporter  # noqa: E402


def records(rng: np.random.Generator, n: int) -> np.ndarray:
    out = np.zeros((n, 8), dtype=np.int64)
    out[:, 0] = 1  # pre_forward
    out[:, 2] = rng.integers(1, 16384, n)  # slot
    out[:, 3] = rng.integers(0, 2000, n)  # position
    out[:, 6] = rng.choice([2, 2 | 256, 2 | 4, 1 | 2], n)  # link, with freed / fingerprint / position
    out[:, 7] = rng.integers(1, 64, n)  # req-pool row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--records", type=int, default=1024, help="new ring records read per step (the ring's size)")
    parser.add_argument("--dropped", type=int, default=3000, help="records past the ring per step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        handler = logging.FileHandler(Path(tmp) / "server.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
        log = logging.getLogger("canary_instrument.runtime")
        log.addHandler(handler)
        log.propagate = False
        reporter = Reporter(mode="log", ring_size=args.records, readback=None, published=None)
        rng = np.random.default_rng(0)
        batches = [records(rng, args.records) for _ in range(64)]
        start = time.perf_counter()
        for step in range(args.steps):
            reporter._report(batches[step % len(batches)], args.dropped, step, step)
            reporter.end_step(step)
        elapsed = time.perf_counter() - start
        handler.close()
        lines = (Path(tmp) / "server.log").read_text().count("\n")
    print(f"{args.steps} steps of {args.records} records: {elapsed / args.steps * 1e6:.0f} us per step, "
          f"{lines} log lines")


if __name__ == "__main__":
    main()
