"""Canary cost per forward against the req pool's capacity: the plan sized by the batch (shipped) or by
the pool (the rule before, reproduced here for the comparison).

Every program of a pass rebuilds the per-request block plan in registers, MAX_BS lanes wide. sglang's
req_to_token has max_running_requests + 1 rows, 2048-4096 requests by default; a plan that wide took
every register and spilled. Timed as bench_kernels.py times the scaling table (per pass inside a graph
of 20, each after an L2 flush), MHA pre + post forward of a decode step.

    PYTHONPATH=$PWD python bench/kernels/plan_width.py --out OUT/plan_width.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels as bk  # noqa: E402

from canary_instrument.runtime.passes import triton_ops  # noqa: E402

SHAPES = [(8, 16384), (64, 4096), (256, 2048), (1024, 1024)]
POOLS = (2049, 4097)


def by_capacity(pool_rows: int):
    """The rule before: MAX_BS = next power of two of max(batch, req-pool rows)."""
    return lambda num_reqs: triton_ops._next_pow2(max(1, num_reqs, pool_rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shipped = triton_ops.plan_width
    rows = []
    for realkv in ("none", "partial"):
        for reqs, ctx in SHAPES:
            for pool in (reqs + 1,) + POOLS:
                for rule in ("batch", "capacity"):
                    triton_ops.plan_width = shipped if rule == "batch" else by_capacity(pool)
                    state, plan, ids = bk.build("mha", realkv, reqs, ctx, pool_rows=pool)
                    ops = bk.make_ops(bk.CONFIGS[0])
                    bk.reset(state)
                    us = bk.per_pass_ms(bk.decode_forward(ops, state, plan, ids)) * 1e3
                    row = dict(realkv=realkv, reqs=reqs, ctx=ctx, pool_rows=pool, rule=rule,
                               max_bs=triton_ops.plan_width(reqs), us=us, violations=int(state.ring_count[0]))
                    bk.log("plan_width", row)
                    rows.append(row)
                    del state, plan
                    torch.cuda.empty_cache()
    triton_ops.plan_width = shipped
    result = {"device": torch.cuda.get_device_name(), "command": "PYTHONPATH=$PWD python " + " ".join(sys.argv),
              "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))
    lines = [f"# Canary pre + post per forward vs req-pool capacity, {result['device']}", "",
             f"`{result['command']}` (per pass inside a graph of 20, L2 flushed before each).", "",
             "| realkv | requests x context | req-pool rows | plan sized by | MAX_BS | us per forward | violations |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['realkv']} | {r['reqs']} x {r['ctx']} | {r['pool_rows']} | {r['rule']} | {r['max_bs']} | "
              f"{r['us']:.1f} | {r['violations']} |" for r in rows]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
