"""Host time of one canary site around a decode whose forward is a replayed CUDA graph: the site's entry and
exit with nothing of the canary running inside (a replay runs no Python), on the CPU test engine.

    PYTHONPATH=. python bench/runtime/site_path.py

Prints the median over 7 rounds of 20,000 steps of microseconds per step. Inside the site the two device
counters a replayed graph's passes would advance are incremented (the health check compares them with the
planned passes); that cost is in the figure. It compares the site paths of two trees run the same way; the
bar (at most 30 us of host time added per decode step) is measured on the GPU by step_overhead.py.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.runtime.mini_engine import MiniRunner, Scheduler, server_args  # noqa: E402


def main() -> None:
    runner = MiniRunner(server_args(), max_reqs=8, max_context=64)
    sched = Scheduler(runner)
    runner.canary_manager.mark_init_finished()
    reqs = [sched.new_request([1, 2, 3, 4]) for _ in range(4)]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [5, 6, 7, 8])
    runner.forward(batch)
    counters = runner.canary_manager.state.counters
    rounds = []
    for _ in range(7):
        n = 20000
        start = time.perf_counter()
        for _ in range(n):
            with runner.canary_ctx(batch, outside=[0], active=0):
                counters[0] += 1  # what the replayed graph's pre and post passes count on the device
                counters[1] += 1
        rounds.append((time.perf_counter() - start) / n * 1e6)
    print(f"site entry + exit around a replayed decode: {statistics.median(rounds):.2f} us per step "
          f"(median of 7 x 20000; rounds {', '.join(f'{r:.2f}' for r in rounds)})")


if __name__ == "__main__":
    main()
