"""Host cost of the reference engine's decode step on CPU, apart from the forward.

(1) Time: a plain (MHA, no EAGLE) engine on CPU whose target forward is stubbed (it hands back a
    fixed logits slice, so the sampled tokens are real and vary per request), filled with
    `--bs` requests of `--context` prompt tokens; the median wall time of `engine.step()` over
    `--steps` decode steps is then the scheduler's and the batch builder's host work (admission
    check, slot allocation, req_to_token write, ForwardBatch, sampling, committing the tokens).
(2) Torch calls per decode step: the calls that reach torch's Python API (a TorchFunctionMode:
    functions, tensor methods, indexing) and the aten ops they dispatch, in one decode step, for
    the plain engine above and, with the real tiny model, for MLA, SWA and EAGLE engines, not
    counting what runs inside the model's forwards (the same number at any batch size). On a GPU
    machine each call costs roughly 5-10 us of host time.

    PYTHONPATH=. python bench/engine/host_step.py --out bench/engine/results --stem host_step_cpu
    # an older engine: git archive <commit> golden/engine | tar -x -C /tmp/old
    PYTHONPATH=. python bench/engine/host_step.py --engine-dir /tmp/old/golden/engine

Run single-threaded (torch.set_num_threads(1)); the figures are this CPU's, not a GPU host's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from canary_instrument.demo import engine_copy  # noqa: E402

VOCAB = 128
COUNT_VARIANTS = {  # name -> engine settings (real tiny model; model forwards not counted)
    "mha": dict(attention_layout="mha"),
    "mla": dict(attention_layout="mla"),
    "swa": dict(attention_layout="swa", sliding_window_size=16),
    "mha+eagle": dict(attention_layout="mha", speculative_algorithm="EAGLE"),
    "swa+eagle": dict(attention_layout="swa", sliding_window_size=16, speculative_algorithm="EAGLE"),
}


class TorchCalls(TorchFunctionMode):
    """Counts torch API calls made while `paused` is 0."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.paused = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.calls[getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))] += 1
        return func(*args, **(kwargs or {}))


class AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def engine_args(bs: int, context: int, margin: int, **overrides) -> dict:
    return dict(device="cpu", vocab_size=VOCAB, max_running_requests=bs, max_context_len=context + margin,
                max_total_tokens=bs * (context + margin), chunked_prefill_size=8192, **overrides)


def fill(engine, bs: int, context: int, new_tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(bs):
        engine.add_request(torch.randint(0, VOCAB, (context,), generator=gen).tolist(), new_tokens)
    while engine.scheduler.waiting or engine.scheduler.chunked_req is not None:
        engine.step()


def stub_target_forward(engine, max_rows: int):
    """The target runner's forward hands back rows of fixed random logits (one per request)."""
    from refsgl.srt.layers.logits_processor import LogitsProcessorOutput
    from refsgl.srt.model_executor.model_runner import ModelRunnerOutput

    logits = torch.rand((max_rows, VOCAB), generator=torch.Generator().manual_seed(0))

    def forward(forward_batch, *args, **kwargs):
        rows = logits[: forward_batch.batch_size]
        return ModelRunnerOutput(LogitsProcessorOutput(next_token_logits=rows, hidden_states=None), False)

    engine.model_runner.forward = forward


def decode_step(engine, bs: int):
    batch = engine.step()
    if batch is None or not batch.forward_mode.is_decode() or batch.batch_size() != bs:
        raise RuntimeError("the measured requests left decode; raise the new-token budget")


def count_step(engine, bs: int, pause_in=()) -> tuple[int, int, dict]:
    """Torch calls and aten ops of one decode step, not counting calls made inside `pause_in`'s methods."""
    calls, ops = TorchCalls(), AtenOps()
    restore = []
    for owner, name in pause_in:
        original = getattr(owner, name)

        def paused(*args, __original=original, **kwargs):
            calls.paused += 1
            ops.paused += 1
            try:
                return __original(*args, **kwargs)
            finally:
                calls.paused -= 1
                ops.paused -= 1

        setattr(owner, name, paused)
        restore.append((owner, name, original))
    try:
        with calls, ops:
            decode_step(engine, bs)
    finally:
        for owner, name, original in restore:
            setattr(owner, name, original)
    return sum(calls.calls.values()), sum(ops.ops.values()), dict(calls.calls.most_common())


def timed_row(module, bs: int, context: int, steps: int) -> dict:
    engine = module.Engine(**engine_args(bs, context, steps + 64, attention_layout="mha"))
    stub_target_forward(engine, max(bs, 8192))
    fill(engine, bs, context, steps + 32)
    for _ in range(5):
        decode_step(engine, bs)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        decode_step(engine, bs)
        times.append(time.perf_counter() - start)
    n_calls, n_ops, calls = count_step(engine, bs)
    median = statistics.median(times) * 1e6
    return dict(requests=bs, context=context, steps=steps, step_us=round(median, 1),
                step_us_per_request=round(median / bs, 2), torch_calls=n_calls, aten_ops=n_ops, calls=calls)


def count_row(module, variant: str, bs: int, context: int) -> dict:
    engine = module.Engine(**engine_args(bs, context, 64, **COUNT_VARIANTS[variant]))
    fill(engine, bs, context, 48)
    for _ in range(3):
        decode_step(engine, bs)
    pause = [(runner.model, "forward") for runner in engine.model_runners]
    pause += [(runner.attn_backend, "init_forward_metadata") for runner in engine.model_runners]
    n_calls, n_ops, calls = count_step(engine, bs, pause)
    return dict(variant=variant, requests=bs, context=context, torch_calls=n_calls, aten_ops=n_ops, calls=calls)


def markdown(report: dict) -> str:
    lines = [
        "# Reference engine: host cost of a decode step apart from the forward (CPU)",
        "",
        f"Command: `{report['command']}`  ",
        f"{report['cpu']}, Python {report['python']}, torch {report['torch']}, one torch thread. "
        f"Engine: `{report['engine_dir']}`.",
        "",
        "## (1) Decode step, target forward stubbed (plain MHA engine)",
        "",
        "| requests x context | step (us, median) | per request (us) | torch calls | aten ops |",
        "|---|---|---|---|---|",
    ]
    for r in report["timed"]:
        lines.append(f"| {r['requests']} x {r['context']} | {r['step_us']} | {r['step_us_per_request']} "
                     f"| {r['torch_calls']} | {r['aten_ops']} |")
    if report["counted"]:
        lines += ["", "## (2) Torch calls per decode step outside the model's forwards (real tiny model)", "",
                  "| engine | requests | torch calls | aten ops |", "|---|---|---|---|"]
        for r in report["counted"]:
            lines.append(f"| {r['variant']} | {r['requests']} | {r['torch_calls']} | {r['aten_ops']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--count-bs", type=int, nargs="*", default=[8, 64],
                        help="batch sizes of (2); none skips it")
    parser.add_argument("--count-context", type=int, default=40)
    parser.add_argument("--engine-dir", type=Path, default=None, help="folder holding refsgl/ (default: pristine)")
    parser.add_argument("--out", type=Path, default=None, help="write STEM.json and STEM.md here")
    parser.add_argument("--stem", default="host_step", help="file name stem under --out (default host_step)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    engine_dir = args.engine_dir or engine_copy.pristine_engine_dir()
    module = engine_copy.import_engine(engine_dir)
    report = dict(command="python bench/engine/host_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  cpu=platform.processor() or platform.machine(), python=platform.python_version(),
                  torch=torch.__version__, engine_dir=str(engine_dir), timed=[], counted=[])
    with torch.no_grad():
        for bs in args.bs:
            row = timed_row(module, bs, args.context, args.steps)
            print(json.dumps({k: v for k, v in row.items() if k != "calls"}), flush=True)
            report["timed"].append(row)
        for variant in COUNT_VARIANTS if args.count_bs else ():
            for bs in args.count_bs:
                row = count_row(module, variant, bs, args.count_context)
                print(json.dumps({k: v for k, v in row.items() if k != "calls"}), flush=True)
                report["counted"].append(row)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{args.stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
