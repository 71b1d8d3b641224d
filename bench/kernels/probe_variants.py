"""Time kernel template variants and register caps against the shipped kernels (single graph replays).

A variant is a copy of ``templates/`` with changes, in ``VARIANTS/<name>/templates`` (keep VARIANTS out
of git, e.g. under ``bench/_work``). Each is rendered (MHA) into ``VARIANTS/<name>/kernels`` here, then
timed on the 1M-position verify (pre-forward, verify only) and the 8 x 16384 decode (pre + post), per
real-KV mode, launch configuration and ``maxnreg``. Check a variant against the torch reference first
(tests/kernels/test_triton_vs_reference.py with its ``_ops`` pointed at the variant's kernels).

    PYTHONPATH=$PWD python bench/kernels/probe_variants.py --variants bench/_work/variants --out OUT/variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels as bk  # noqa: E402

from canary_instrument.codegen.build import render_kernels  # noqa: E402
from canary_instrument.runtime.passes import triton_ops  # noqa: E402
from canary_instrument.runtime.passes.triton_ops import TritonCanaryOps  # noqa: E402

CONFIGS = ((128, 4, 16), (128, 4, 8), (256, 8, 8))  # (BLOCK, num_warps, programs/SM)
MAXNREG = (None, 64, 96)  # tried on the first configuration


def registers(ops, state) -> dict:
    module = triton_ops.load_kernel_module(triton_ops.state_spec(state), ops.kernel_dir)
    out = {}
    for name in ("canary_pre_forward", "canary_post_forward"):
        for cache in getattr(module, name).device_caches.values():
            for kernel in cache[0].values():
                out[name] = (kernel.n_regs, kernel.n_spills)  # the last variant compiled
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dirs = [None]
    for d in sorted(p for p in args.variants.iterdir() if (p / "templates").is_dir()):
        render_kernels(d / "templates", d / "kernels", layouts=["mha"])
        dirs.append(d / "kernels")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for realkv in ("none", "partial"):
        big = bk.build("mha", realkv, 64, 16385)
        big[1].extend_lens.zero_()  # verify only
        small = bk.build("mha", realkv, 8, 16384)
        for d in dirs:
            for config in CONFIGS:
                for maxnreg in MAXNREG:
                    if maxnreg and config != CONFIGS[0]:
                        continue
                    ops = TritonCanaryOps(block=config[0], num_warps=config[1], programs=sms * config[2],
                                          kernel_dir=d, maxnreg=maxnreg)
                    state, plan, ids = big
                    bk.reset(state)
                    verify_us = bk.bench_graph(lambda: ops.pre_forward(state, plan, ids)) * 1e3
                    bad = int(state.ring_count[0])
                    s_state = small[0]
                    bk.reset(s_state)
                    small_us = bk.bench_graph(bk.decode_forward(ops, *small)) * 1e3
                    row = dict(variant=d.parent.name if d else "shipped", realkv=realkv, config=config,
                               maxnreg=maxnreg, verify_us=verify_us, small_us=small_us,
                               violations=bad + int(s_state.ring_count[0]), registers=registers(ops, state))
                    bk.log("variant", row)
                    rows.append(row)
        del big, small
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "copy_tb_s": bk.copy_bandwidth() / 1e12,
              "command": "PYTHONPATH=$PWD python " + " ".join(sys.argv), "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
