"""Decode-step time of the instrumented reference engine with the KV canary off vs on, side by side.

The engine is sized so one decode step moves Llama-3-8B-like KV per layer (8 KV heads x 128,
bf16: 4 KiB per token per layer) for `--batch` requests of `--context` tokens. Both engines
(canary off; canary on in log mode with the real-KV fingerprint of the first 16 bytes) hold
the same requests; steps alternate between them in rounds, each timed with the device
synchronised around it. A device-to-device copy measured in the same run converts the
batch's KV bytes into the time attention needs to read them, the yardstick of DESIGN.md's
0.5 % bar. Writes overhead.json and overhead.md to --out.

    python bench/engine/overhead.py --out bench/engine/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from canary_instrument.demo import engine_copy, matrix  # noqa: E402

SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    dtype="bfloat16",
    kv_canary_real_kv="partial",
    speculative_algorithm=None,
    disable_radix_cache=True,
)


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted as 2 * nbytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 20 / (start.elapsed_time(end) / 1000)


def fill(engine, batch: int, context: int, new_tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(batch):
        prompt = torch.randint(0, SHAPE["vocab_size"], (context,), generator=gen).tolist()
        engine.add_request(prompt, new_tokens)
    while engine.scheduler.waiting or engine.scheduler.chunked_req is not None:
        engine.step()


def timed_decode_steps(engine, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        batch = engine.step()
        torch.cuda.synchronize()
        if batch is None or not batch.forward_mode.is_decode():
            raise RuntimeError("the measured requests finished or left decode; raise --new-tokens")
        times.append(time.perf_counter() - start)
    return times


def measure(module, batch: int, context: int, steps: int, rounds: int) -> dict:
    args = dict(matrix.ENGINE_DEFAULTS, **SHAPE, attention_layout="mha", max_running_requests=batch,
                cuda_graph_max_bs=batch, max_context_len=context + steps * rounds + 64,
                max_total_tokens=batch * (context + steps * rounds + 64), chunked_prefill_size=8192)
    new_tokens = steps * rounds + 16
    engines = {}
    for mode in ("none", "log"):
        engines[mode] = module.Engine(**dict(args, kv_canary=mode))
        fill(engines[mode], batch, context, new_tokens, seed=0)
        timed_decode_steps(engines[mode], 5)  # warm-up
    times = {"none": [], "log": []}
    for _ in range(rounds):
        for mode, engine in engines.items():
            times[mode] += timed_decode_steps(engine, steps)
    violations = len(engines["log"].model_runner.canary_manager.flush())
    kv_bytes_per_token = 2 * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * 2 * SHAPE["num_hidden_layers"]
    mean_context = context + steps * rounds / 2
    off, on = statistics.median(times["none"]), statistics.median(times["log"])
    stats = engines["log"].model_runner.canary_manager.stats()
    for engine in engines.values():
        del engine
    return {
        "batch": batch,
        "context": context,
        "decode_steps_each": len(times["log"]),
        "off_ms": round(off * 1e3, 3),
        "on_ms": round(on * 1e3, 3),
        "canary_ms": round((on - off) * 1e3, 3),
        "overhead_percent_of_step": round(100 * (on - off) / off, 2),
        "kv_bytes_read_per_step": int(batch * mean_context * kv_bytes_per_token),
        "violations": violations,
        "canary_stats": {"verified": stats.verified, "written": stats.written},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["8x4096", "32x2048", "64x1024"],
                        help="decode batches as REQUESTSxCONTEXT")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--real-kv", choices=("none", "partial", "all"), default=SHAPE["kv_canary_real_kv"],
                        help="kv_canary_real_kv (all: every layer's whole rows, a debug mode)")
    args = parser.parse_args()
    SHAPE["kv_canary_real_kv"] = args.real_kv
    if not torch.cuda.is_available():
        print("overhead.py measures the CUDA-graph decode path: it needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    matrix.quiet_canary_log()
    root = Path(tempfile.mkdtemp(prefix="canary-overhead-")) / "engine"
    engine_copy.copy_engine(root)
    engine_copy.instrument(root)
    module = engine_copy.import_engine(root)

    bandwidth = copy_bandwidth()
    rows = []
    for shape in args.shapes:
        batch, context = (int(x) for x in shape.split("x"))
        row = measure(module, batch, context, args.steps, args.rounds)
        row["kv_read_ms_at_copy_bandwidth"] = round(row["kv_bytes_read_per_step"] / bandwidth * 1e3, 3)
        row["canary_percent_of_kv_read"] = round(100 * row["canary_ms"] / row["kv_read_ms_at_copy_bandwidth"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    report = {
        "command": " ".join(["python"] + sys.argv),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "engine_shape": SHAPE,
        "copy_bandwidth_GBps": round(bandwidth / 1e9, 1),
        "rows": rows,
    }
    (args.out / "overhead.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Canary overhead on the reference engine, {report['device']}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']}; engine: 8 layers, hidden 2048, 16 query / 8 KV heads x 128, bf16 "
        f"(4 KiB KV per token per layer, as Llama-3-8B), CUDA-graph decode, canary `log` + real-KV `partial`. "
        f"Device-to-device copy: {report['copy_bandwidth_GBps']} GB/s.",
        "",
        "| requests x context | step off (ms) | step on (ms) | canary (ms) | % of step | KV read per step (MB) "
        "| KV read at copy bandwidth (ms) | canary % of KV read | violations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} x {r['context']} | {r['off_ms']} | {r['on_ms']} | {r['canary_ms']} | "
            f"{r['overhead_percent_of_step']} | {r['kv_bytes_read_per_step'] / 1e6:.0f} | "
            f"{r['kv_read_ms_at_copy_bandwidth']} | {r['canary_percent_of_kv_read']} | {r['violations']} |"
        )
    (args.out / "overhead.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
