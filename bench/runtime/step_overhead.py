"""Per-decode-step cost of the canary's outside-graph work: host wall time and the torch ops it issues.

Drives the runtime on the sglang-shaped test engine (tests/runtime/mini_engine.py): requests
are prefilled, then decoded step by step. Only the two outside-graph phases are measured:
entering ``with_ops_outside_graph`` (plan + expected tokens + upload) and leaving it (disable,
readback, bookkeeping); the bracketed model forward between them (the in-graph canary kernels)
is run but not timed. A second pass under ``torch.profiler`` counts the top-level aten ops of
each phase, i.e. what the runtime itself calls; on a GPU each such op on a device tensor is a
kernel launch or a copy, and ``--device cuda`` also counts the device kernels and H2D/D2H
memcpys the profiler sees.

    PYTHONPATH=. python bench/runtime/step_overhead.py --steps 300 --out bench/runtime/results/before.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from canary_instrument.runtime import mark_init_finished  # noqa: E402
from tests.runtime.mini_engine import MiniRunner, Scheduler, draft_step_batches, server_args  # noqa: E402

PROMPT = 32
PHASES = ("pre", "post")
# Ops that only make a tensor view or wrap a value: no kernel, no copy on any device.
METADATA_OPS = {
    "aten::slice", "aten::select", "aten::view", "aten::as_strided", "aten::unsqueeze", "aten::expand",
    "aten::reshape", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::to", "aten::t", "aten::permute", "aten::empty", "aten::empty_strided",
    "aten::from_blob", "aten::_reshape_alias", "aten::squeeze", "aten::unbind",
}


class Case:
    """One engine: ``bs`` requests prefilled, decoded with ``subs`` sub-forwards per step."""

    def __init__(self, bs: int, tokens: bool, subs: int, steps: int, device: str):
        self.bs, self.tokens, self.subs, self.device = bs, tokens, subs, device
        context = PROMPT + (steps + 64) * subs + 8
        args = server_args(
            kv_canary_token_check=tokens,
            speculative_num_steps=subs + 1 if subs > 1 else None,
        )
        self.runner = MiniRunner(args, device=device, size=bs * context + 8, max_reqs=bs, max_context=context)
        self.manager = self.runner.canary_manager
        if self.manager.num_single_forward != subs:
            raise RuntimeError(f"expected {subs} sub-forwards, the manager has {self.manager.num_single_forward}")
        self.sched = Scheduler(self.runner, token_ids=tokens)
        mark_init_finished(self.manager)
        self.reqs = [self.sched.new_request([(7 * b + p) % 1000 + 1 for p in range(PROMPT)]) for b in range(bs)]
        self.runner.forward(self.sched.extend(self.reqs))
        self.next_token = 0

    def _batches(self):
        """The outside batch and the per-sub-forward batches of the next step."""
        self.next_token += 1
        if self.subs == 1:
            batch = self.sched.decode(self.reqs, [(self.next_token + b) % 1000 + 1 for b in range(self.bs)])
            return batch, [batch]
        guesses = [[(self.next_token + b + i) % 1000 + 1 for i in range(self.subs)] for b in range(self.bs)]
        token_ids = [list(r.tokens) for r in self.reqs] if self.tokens else None
        return draft_step_batches(self.sched, self.reqs, self.subs, guesses, token_ids=token_ids)

    def step(self, clock=time.perf_counter, mark=None):
        """One step; returns the host seconds of the pre and post outside-graph phases."""
        outer, per_sub = self._batches()
        model = self.runner.model
        ctx = self.manager.with_ops_outside_graph(range(self.subs), outer)
        with mark("pre") if mark else _null():
            t0 = clock()
            ctx.__enter__()
            t1 = clock()
        for i, batch in enumerate(per_sub):
            with self.manager.with_active_single_forward_manager(i):
                model.forward(batch.input_ids, batch.positions, batch)
        if self.device == "cuda":
            torch.cuda.synchronize()
        with mark("post") if mark else _null():
            t2 = clock()
            ctx.__exit__(None, None, None)
            t3 = clock()
        return t1 - t0, t3 - t2


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _phase_of(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("canary."):
            return parent.name[len("canary."):]
        parent = parent.cpu_parent
    return None


def _top_level(event) -> bool:
    """An aten op the runtime called itself (not one nested inside another aten op)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("canary."):
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return event.name.startswith("aten::")


def count_ops(case: Case, steps: int) -> dict:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            case.step(mark=lambda phase: record_function(f"canary.{phase}"))
    per_phase = {p: collections.Counter() for p in PHASES}
    for ev in prof.events():
        phase = _phase_of(ev)
        if phase in per_phase and _top_level(ev):
            per_phase[phase][ev.name] += 1
    out = {}
    for phase, names in per_phase.items():
        out[phase] = {
            "aten_ops": sum(names.values()) / steps,
            # Each of these is a kernel launch or a copy when its tensors are on a GPU.
            "work_ops": sum(v for k, v in names.items() if k not in METADATA_OPS) / steps,
            "by_name": {k: v / steps for k, v in sorted(names.items())},
        }
    if case.device == "cuda":
        # Device activity is attributed to the step window as a whole (launches are asynchronous).
        kinds = collections.Counter()
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                name = ev.name
                kinds["memcpy_h2d" if "HtoD" in name else "memcpy_d2h" if "DtoH" in name else "kernels"] += 1
        out["device_per_step_incl_model"] = {k: v / steps for k, v in kinds.items()}
    return out


def run_case(bs, tokens, subs, steps, warmup, profile_steps, device):
    case = Case(bs, tokens, subs, steps + warmup + profile_steps, device)
    for _ in range(warmup):
        case.step()
    pre, post = [], []
    for _ in range(steps):
        a, b = case.step()
        pre.append(a)
        post.append(b)
    ops = count_ops(case, profile_steps)
    found = case.manager.flush()
    if found:
        raise RuntimeError(f"the clean benchmark run reported {len(found)} violations")
    us = lambda xs: round(statistics.median(xs) * 1e6, 1)  # noqa: E731
    total = [a + b for a, b in zip(pre, post)]
    return dict(
        bs=bs, token_check=tokens, sub_forwards=subs, steps=steps,
        pre_us_median=us(pre), post_us_median=us(post), total_us_median=us(total),
        total_us_p10=round(sorted(total)[len(total) // 10] * 1e6, 1),
        pre_aten_ops=ops["pre"]["aten_ops"], post_aten_ops=ops["post"]["aten_ops"],
        pre_work_ops=ops["pre"]["work_ops"], post_work_ops=ops["post"]["work_ops"],
        ops=ops,
    )


def markdown(rows) -> str:
    lines = [
        "| bs | token check | sub-forwards | pre (us) | post (us) | total (us, median) | total p10 (us) | aten ops pre / post | of which kernel or copy, pre / post |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['bs']} | {'on' if r['token_check'] else 'off'} | {r['sub_forwards']} | {r['pre_us_median']} | "
            f"{r['post_us_median']} | {r['total_us_median']} | {r['total_us_p10']} | "
            f"{r['pre_aten_ops']:g} / {r['post_aten_ops']:g} | {r['pre_work_ops']:g} / {r['post_work_ops']:g} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=300, help="timed decode steps per case")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--draft-subs", type=int, default=3, help="also run bs 64 with this many sub-forwards (0: skip)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here (and .md beside it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = [(bs, tok, 1) for bs in args.bs for tok in (True, False)]
    if args.draft_subs > 1:
        cases += [(64, True, args.draft_subs)]
    rows = []
    for bs, tok, subs in cases:
        row = run_case(bs, tok, subs, args.steps, args.warmup, args.profile_steps, args.device)
        rows.append(row)
        print(markdown([row]).splitlines()[-1], flush=True)
    meta = dict(
        device=args.device, torch=torch.__version__, python=platform.python_version(),
        cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
        loadavg=os.getloadavg(), command=" ".join(sys.argv),
    )
    table = markdown(rows)
    print(table)
    for r in rows:
        for phase in PHASES:
            print(f"bs={r['bs']} tokens={r['token_check']} subs={r['sub_forwards']} {phase}: {r['ops'][phase]['by_name']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        args.out.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
