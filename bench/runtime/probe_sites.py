"""Host time of each wired site, in place, for a decode and an EAGLE step, and which path it took.

Runs the instrumented reference engine (canary on, CUDA graphs) and times every canary site's entry
plus exit (the context object of `manager.site_context`; the graph replay between them not counted,
and before each exit an untimed stream query absorbs the graph submission, as in step_overhead.py),
per site: (manager: 0 target / 1 draft, the outside-graph listing, the active sub-forward). Counts
per step: inline or general path, the manager's poll of published passes, its snapshot step end; and
per site the median of the exits that ran a step end (a snapshot taken or harvested) alone.

    PYTHONPATH=$PWD python bench/runtime/probe_sites.py --steps 300
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "runtime"))

import torch  # noqa: E402
from step_overhead import Case, timed_engine  # noqa: E402

from canary_instrument.runtime import manager as M  # noqa: E402
from canary_instrument.runtime.setup.sites import Site  # noqa: E402


def _key(site) -> str:
    return f"{site._manager.state.token_offset} {list(site.listing or [])} {site.index}"


class Probe:
    """Patches the site and manager methods for the timed steps only."""

    def __init__(self, device: str):
        self.device = device
        self.times = collections.defaultdict(list)
        self.counts = collections.Counter()
        self._entered = {}
        self.step_ends = 0
        self._saved = (Site.__enter__, Site.__exit__, M.CanaryManager.end_step,
                       M.CanaryManager._poll_published)

    def __enter__(self):
        enter, exit_, step_end, poll = self._saved
        probe = self

        def timed_enter(site):
            t0 = time.perf_counter()
            value = enter(site)
            probe._entered[id(site)] = time.perf_counter() - t0
            return value

        def timed_exit(site, *exc):
            if probe.device == "cuda" and not torch.cuda.is_current_stream_capturing():
                torch.cuda.current_stream().query()
            path = "inline" if site._inline else "general"
            ends = probe.step_ends
            t0 = time.perf_counter()
            out = exit_(site, *exc)
            spent = time.perf_counter() - t0 + probe._entered.pop(id(site), 0.0)
            probe.times[_key(site)].append(spent)
            if probe.step_ends != ends:  # this exit ran the manager's step end (snapshot, or its harvest)
                probe.times[f"{_key(site)} with step end"].append(spent)
            probe.counts[f"{_key(site)} {path}"] += 1
            return out

        def counted_step_end(manager, *args, **kwargs):
            probe.counts[f"manager {manager.state.token_offset} step end"] += 1
            probe.step_ends += 1
            return step_end(manager, *args, **kwargs)

        def counted_poll(manager):
            probe.counts[f"manager {manager.state.token_offset} poll"] += 1
            return poll(manager)

        Site.__enter__, Site.__exit__ = timed_enter, timed_exit
        M.CanaryManager.end_step, M.CanaryManager._poll_published = counted_step_end, counted_poll
        return self

    def __exit__(self, *exc):
        Site.__enter__, Site.__exit__, M.CanaryManager.end_step, M.CanaryManager._poll_published = self._saved
        return False


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["1x8", "3x8", "3x256", "1x256"],
                        help="SUBSxBS: 1 = decode, 3 = EAGLE with 3 draft forwards")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    module = timed_engine("canary-probe-")  # Case.step reads the sites' clock
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{name}; per site (manager, outside listing, active): median enter + exit (us) over {args.steps} steps")
    for spec in args.cases:
        subs, bs = (int(x) for x in spec.split("x"))
        case = Case(module, bs, subs, True, args.steps + 40, args.device)
        for _ in range(20):
            case.step()
        with Probe(args.device) as probe:
            for _ in range(args.steps):
                case.step()
        times = {k: round(statistics.median(v) * 1e6, 2) for k, v in probe.times.items()}
        counts = {k: round(v / args.steps, 3) for k, v in probe.counts.items()}
        print(f"subs {subs} bs {bs}: {times}\n  per step: {counts}", flush=True)
        del case


if __name__ == "__main__":
    main()
