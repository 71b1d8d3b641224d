"""Checks that ``combine`` returns only after gloo's worker thread has dropped the collective's tensors.

Run as a script (it pins itself to one CPU and demotes gloo's worker threads, so it must not
share a process with the test runner); prints one JSON line. Pinned and demoted, the worker
thread gets the CPU only while the main thread blocks, so the late release that aborts a
loaded machine at exit is made to happen every time.
"""

import json
import os
import sys
import time
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before torch starts any thread

import torch.distributed as dist  # noqa: E402

from canary_instrument.runtime.checks.distributed import combine  # noqa: E402


GLOO_WORKER_THREADS = 2  # ProcessGroupGloo's default


def _gloo_worker_threads() -> list[int]:
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "pt_gloo_runloop":
                    tids.append(int(tid))
        except FileNotFoundError:  # a thread that just ended
            pass
    return tids


def _demote_gloo_workers(expected: int) -> int:
    """SCHED_IDLE for every gloo worker thread (they name themselves once started, so wait for that)."""
    deadline = time.monotonic() + 30
    while len(_gloo_worker_threads()) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    tids = _gloo_worker_threads()
    for tid in tids:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    return len(tids)


def main():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    handed_over = []
    real_all_gather = dist.all_gather

    def recording_all_gather(tensor_list, tensor, *args, **kwargs):
        handed_over.extend(weakref.ref(t) for t in (tensor, *tensor_list))
        return real_all_gather(tensor_list, tensor, *args, **kwargs)

    dist.all_gather = recording_all_gather
    demoted = _demote_gloo_workers(GLOO_WORKER_THREADS)
    reports = combine(dist.group.WORLD, 3, True, 7)
    still_held = sum(ref() is not None for ref in handed_over)  # no blocking call before this line
    result = {
        "demoted": demoted,
        "handed_over": len(handed_over),
        "still_held": still_held,
        "reports": [[r.rank, r.violations, r.unhealthy, r.written] for r in reports],
    }
    print(json.dumps(result), flush=True)
    dist.all_gather = real_all_gather
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
