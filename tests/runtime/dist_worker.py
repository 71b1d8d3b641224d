"""One rank of the cross-rank canary tests; run as a script, prints one JSON result line.

usage: dist_worker.py SCENARIO RANK WORLD PORT BACKEND DEVICE
"""

import json
import logging
import os
import sys
from datetime import timedelta
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from canary_instrument.runtime import CanaryError, mark_init_finished  # noqa: E402
from canary_instrument.runtime.step.bracket import unbracket_model_forward  # noqa: E402
from mini_engine import MiniRunner, Scheduler, server_args  # noqa: E402


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class TPRunner(MiniRunner):
    """Exposes the process group the way sglang does (``tp_group.cpu_group``)."""

    def __init__(self, *args, group, **kw):
        self.tp_group = SimpleNamespace(cpu_group=group, device_group=group)
        super().__init__(*args, **kw)


def main():
    scenario, rank, world, port, backend, device = sys.argv[1:7]
    rank, world = int(rank), int(world)
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    # A collective without a partner fails within a minute instead of hanging the test.
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    handler = LogLines()
    logger = logging.getLogger("canary_instrument.runtime")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    mode = "log" if scenario in ("log_counts", "uneven_warmup") else "raise"
    # A tagged snapshot every step: the health check then shows up one step late, as the tests expect.
    runner = TPRunner(server_args(kv_canary=mode, kv_canary_dist_interval=2, kv_canary_readback_interval=1),
                      device=device, group=dist.group.WORLD)
    sched = Scheduler(runner)
    if scenario == "uneven_warmup" and rank == 1:
        warm = sched.new_request([9, 9, 9])  # a warm-up forward that rank 0 does not run
        runner.forward(sched.extend([warm]))
        sched.finish(warm)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([1, 2, 3, 4]), sched.new_request([5, 6, 7])]
    result = {"rank": rank, "error": None, "error_step": None, "message": ""}
    try:
        runner.forward(sched.extend(reqs))  # step 1
        for i in range(6):  # steps 2..7
            batch = sched.decode(reqs, [10 + i, 20 + i])
            if rank == 1 and i == 0 and scenario != "uneven_warmup":
                if scenario == "health":
                    unbracket_model_forward(runner.model)
                else:
                    runner.req_to_token_pool.req_to_token[reqs[0].row, 1] = reqs[1].slots[1]
            runner.forward(batch)
    except CanaryError as err:
        result.update(error=type(err).__name__, error_step=runner.canary_manager.step, message=str(err))
    result["local_violations"] = runner.canary_manager.stats().violations
    result["rank_lines"] = [line for line in handler.lines if line.startswith("kv_canary ranks:")]
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
