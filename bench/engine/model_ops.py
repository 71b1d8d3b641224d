"""Ops per decode forward of the reference engine's model, counted with torch.profiler on CPU.

Each op the forward issues is a kernel launch on a GPU (a few microseconds each even inside a CUDA
graph), so their number bounds how close the engine's decode step can get to its weight + KV read
floor. Counted for the two paths the engine has:

- `cuda`: what a CUDA engine runs (Triton attention backend; Triton RMSNorm / rotary kernels where
  the engine has them), here through Triton's interpreter; each Triton launch counts as one op and
  the interpreter's own tensor traffic inside it is not counted.
- `cpu`: what a CPU engine runs (torch-native attention, the layers' torch paths).

An op is a top-level aten call inside the decode forward (`refsgl.forward.decode`, the span the
engine's step tracing opens) whose call tree does any work; views and other metadata-only calls
(`view`, `slice`, `split`, a same-dtype `to`, `empty`, ...) are not ops. Calls under the attention
backend (`init_forward_metadata`, `forward`) are counted apart from the rest of the model. Host reads
(`aten::item`) are listed: none may sit in a CUDA-graph-captured forward.

    PYTHONPATH=. python bench/engine/model_ops.py --out bench/engine/results/model_ops
    PYTHONPATH=. python bench/engine/model_ops.py --engine-dir /tmp/old/golden/engine --out /tmp/model_ops_old

`--engine-dir` points at another copy of `golden/engine` (e.g. `git archive <rev> golden/engine`) to
count an older engine; `--smoke` runs a tiny model for a test.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import os
import platform
import sys
from pathlib import Path

if __name__ == "__main__":
    # Before triton is imported: the cuda path runs interpreted here. (Importers, i.e. tests, set it themselves.)
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from canary_instrument.demo import engine_copy  # noqa: E402

# step_floor.py's engine: 8 layers, Llama-3-8B's per-layer attention shape, bf16.
ENGINE_SHAPE = dict(
    vocab_size=32000, hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64, sliding_window_size=16, dtype="bfloat16",
)
SMOKE_SHAPE = dict(ENGINE_SHAPE, vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, kv_lora_rank=32, qk_rope_head_dim=8)
LAYOUTS = ("mha", "mla", "swa")
PATHS = {"cuda": "triton", "cpu": "torch_native"}  # path -> attention backend
DECODE_SPAN = "refsgl.forward.decode"
ATTENTION_SPAN = "bench.attention"
# Calls that only make a view, reinterpret or allocate: no kernel, no copy on any device (unless a
# child does work, e.g. a `to` that converts).
METADATA_OPS = {
    "aten::slice", "aten::select", "aten::view", "aten::as_strided", "aten::unsqueeze", "aten::expand",
    "aten::reshape", "aten::alias", "aten::detach", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::to", "aten::t", "aten::permute", "aten::empty", "aten::empty_strided",
    "aten::from_blob", "aten::_reshape_alias", "aten::squeeze", "aten::unbind", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::narrow", "aten::transpose", "aten::_unsafe_view",
    "aten::expand_as", "aten::view_as", "aten::contiguous", "aten::empty_like",
}


@contextlib.contextmanager
def _labelled_triton_launches():
    """Run every interpreted Triton launch under a `triton::<kernel>` profiler span (one op each)."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def labelled_run(self, *args, **kwargs):
        with record_function(f"triton::{self.fn.__name__}"):
            return run(self, *args, **kwargs)

    InterpretedFunction.run = labelled_run
    try:
        yield
    finally:
        InterpretedFunction.run = run


def _does_work(event) -> bool:
    if event.name not in METADATA_OPS:
        return True
    return any(_does_work(child) for child in event.cpu_children if child.name.startswith("aten::"))


def count_ops(events) -> dict:
    """Top-level ops under the decode span, split into model and attention, by name."""
    counts = {"model": collections.Counter(), "attention": collections.Counter()}
    host_reads = 0
    for event in events:
        if not _is_op_name(event.name):
            continue
        spans, parent = [], event.cpu_parent
        while parent is not None:
            spans.append(parent.name)
            parent = parent.cpu_parent
        if DECODE_SPAN not in spans or any(_is_op_name(name) for name in spans):
            continue  # outside the forward, or inside another op (counted with it)
        if event.name in ("aten::item", "aten::_local_scalar_dense"):
            host_reads += 1
        if event.name.startswith("triton::") or _does_work(event):
            counts["attention" if ATTENTION_SPAN in spans else "model"][event.name] += 1
    return {
        "model_ops": sum(counts["model"].values()),
        "attention_ops": sum(counts["attention"].values()),
        "host_reads": host_reads,
        "model_by_name": dict(counts["model"].most_common()),
        "attention_by_name": dict(counts["attention"].most_common()),
    }


def _is_op_name(name: str) -> bool:
    return name.startswith("aten::") or name.startswith("triton::")


def _span(fn):
    def wrapped(*args, **kwargs):
        with record_function(ATTENTION_SPAN):
            return fn(*args, **kwargs)

    return wrapped


def measure(engine_mod, layout: str, path: str, shape: dict, requests: int, prompt_len: int) -> dict:
    try:
        custom_op = importlib.import_module("refsgl.srt.layers.custom_op")
        triton_layers = custom_op.triton_everywhere if path == "cuda" else contextlib.nullcontext
    except ModuleNotFoundError:  # an engine from before the layers had a Triton path: torch ops on every device
        triton_layers = contextlib.nullcontext
    torch.manual_seed(0)
    engine = engine_mod.Engine(
        **shape, attention_layout=layout, attention_backend=PATHS[path], device="cpu", disable_radix_cache=True,
        enable_step_tracing=True, max_running_requests=requests, max_context_len=prompt_len + 16,
        max_total_tokens=requests * (prompt_len + 16), chunked_prefill_size=requests * prompt_len,
    )
    for r in range(requests):
        engine.add_request([(7 * r + p) % shape["vocab_size"] for p in range(prompt_len)], 8)
    backend = engine.model_runner.attn_backend
    backend.forward = _span(backend.forward)
    backend.init_forward_metadata = _span(backend.init_forward_metadata)
    engine.step()  # prefill, on the torch layers: the interpreter would take a program per prompt token
    with triton_layers():
        engine.step()  # first decode (warm)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.step()
    row = count_ops(prof.events())
    row.update(layout=layout, path=path, attention_backend=PATHS[path], requests=requests)
    row["per_layer"] = round(row["model_ops"] / shape["num_hidden_layers"], 1)
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# Ops per decode forward ({meta['engine_dir']})", "",
        f"Command: `{meta['command']}`  ", f"torch {meta['torch']}, {meta['platform']}; model {meta['shape']}", "",
        "| layout | path | model ops | per layer | attention ops | host reads |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['layout']} | {r['path']} ({r['attention_backend']}) | {r['model_ops']} | {r['per_layer']} "
                     f"| {r['attention_ops']} | {r['host_reads']} |")
    lines += ["", "Ops by name (model; attention):", ""]
    for r in rows:
        lines.append(f"- {r['layout']}/{r['path']}: {r['model_by_name']}; {r['attention_by_name']}")
    return "\n".join(lines) + "\n"


def _save(out: Path, rows: list[dict], meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, meta))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-dir", type=Path, default=ROOT / "golden" / "engine",
                        help="folder holding the refsgl package to count (default: this checkout's)")
    parser.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="tiny model (tests)")
    args = parser.parse_args(argv)

    torch.set_num_threads(min(4, os.cpu_count() or 1))
    engine_mod = engine_copy.import_engine(args.engine_dir)  # replaces any refsgl imported before
    if Path(engine_mod.__file__).resolve().parents[3] != args.engine_dir.resolve():
        raise RuntimeError(f"refsgl was imported from {engine_mod.__file__}, not from {args.engine_dir}")
    shape = SMOKE_SHAPE if args.smoke else ENGINE_SHAPE
    command = " ".join(["python bench/engine/model_ops.py", *(sys.argv[1:] if argv is None else argv)])
    meta = dict(
        engine_dir=str(args.engine_dir), command=command,
        torch=torch.__version__, platform=platform.platform(), shape=shape,
    )
    rows = []
    for layout in args.layouts:
        for path in args.paths:
            with _labelled_triton_launches():
                row = measure(engine_mod, layout, path, shape, args.requests, args.prompt_len)
            print(f"{layout:4} {path:5} model {row['model_ops']:4} ({row['per_layer']}/layer) "
                  f"attention {row['attention_ops']:3} host reads {row['host_reads']}", flush=True)
            rows.append(row)
            if args.out:  # saved as measured: a long run cut short keeps its rows
                _save(args.out, rows, meta)
    return rows


if __name__ == "__main__":
    main()
