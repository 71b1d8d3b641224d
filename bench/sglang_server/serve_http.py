"""sglang's HTTP server (``python -m sglang.launch_server``) under sglang's own ``bench_serving``, one way.

    python bench/sglang_server/serve_http.py --out r.json [--kv-canary none|log] [--port 30000]
        [--rates 8 32 inf] [--num-prompts 96] [--input-len 1024] [--output-len 128]

Which sglang runs is whatever ``import sglang`` finds (``gpu.sh`` sets ``PYTHONPATH`` as for ``serve.py``).
The server serves the 32-layer Llama-3-8B with random weights and the word-level tokenizer ``models.py``
writes beside it (no model hub is reachable), with the settings a user passes for that on this image
(Triton attention: the carried sgl-kernel has no FA3), everything else sglang's defaults. For each
request rate, ``bench_serving --dataset-name random-ids`` sends ``--num-prompts`` prompts of token ids
(runs of consecutive ids from a random start; a seed per rate, the same in every way, so no rate reuses
another's prompts from the radix cache), and its JSON result is kept; the client runs in this process
(``bench``). The server's log (its processes write to this process's stderr) holds sglang's scheduler
lines and the canary's, between ``http: begin rate R``/``http: end rate R`` marks; a perturbation run
(``--perturb``) is scored from it as ``serve.py``'s are.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import LLAMA3_8B, write_model, write_tokenizer  # noqa: E402
from serve import nccl_port, which_sglang  # noqa: E402

# Kept from bench_serving's result line: throughput and the latency percentiles the tables show.
METRICS = ("completed", "duration", "request_throughput", "output_throughput", "total_throughput",
           "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms",
           "max_concurrent_requests", "total_input_tokens", "total_output_tokens")


def server_command(args, model: Path) -> list[str]:
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "dummy",
               "--host", "127.0.0.1", "--port", str(args.port), "--attention-backend", args.attention_backend,
               "--sampling-backend", "pytorch", "--grammar-backend", "none", "--kv-canary", args.kv_canary,
               "--mem-fraction-static", str(args.mem_fraction), "--max-running-requests", str(args.max_running),
               "--cuda-graph-max-bs-decode", str(args.max_running), "--random-seed", str(args.seed),
               "--log-level", "info", "--nccl-port", str(nccl_port())]
    if args.kv_canary != "none":  # as the cost suite: the first 16 bytes of each real KV slot hashed, both canaries
        command += ["--kv-canary-real-data", "partial"]
    if args.perturb:
        command += ["--kv-canary-sweep-interval", "16"]
    if args.max_total_tokens:  # a server sharing the GPU with other engines caps its pool
        command += ["--max-total-tokens", str(args.max_total_tokens)]
    return command


def wait_ready(server: subprocess.Popen, port: int, limit_s: float) -> None:
    """Until the server answers a generate (``/health_generate``), or raise when it exits or the limit passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"the server was not ready within {limit_s:.0f} s")


def bench(args, model: Path, rate: str, prompts: int, seed: int, result_file: Path, mark: str) -> dict:
    """One ``bench_serving`` run of ``prompts`` prompts at ``rate``; its result line's ``METRICS``.

    sglang's own command line, ``python -m sglang.bench_serving``, run in this process (``runpy``, with its
    arguments in ``sys.argv``): its imports (transformers, datasets, ...) take longer than a run, and are paid
    once, while the server starts. Releases differ in where its code lives (0.5.17 moved it to
    ``sglang.benchmark.serving``, 0.5.14 runs it under ``__main__``); the module as a command runs in both."""
    sys.argv = ["bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port", str(args.port),
                "--model", str(model), "--tokenizer", str(model), "--dataset-name", "random-ids",
                "--num-prompts", str(prompts), "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--random-range-ratio", "0.5", "--request-rate", rate,
                "--seed", str(seed), "--output-file", str(result_file), "--disable-tqdm"]
    print(f"http: begin {mark}", file=sys.stderr, flush=True)
    try:
        runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:  # a command may end with sys.exit; only a failure is one here
        if exit_.code not in (None, 0):
            raise RuntimeError(f"bench_serving exited with {exit_.code} at rate {rate}") from None
    print(f"http: end {mark}", file=sys.stderr, flush=True)
    line = result_file.read_text().strip().splitlines()[-1]
    return {"rate": rate, **{k: json.loads(line).get(k) for k in METRICS}}


def stop(server: subprocess.Popen) -> int:
    """SIGTERM to the server's process group (sglang's own handler tears its processes down), SIGKILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            return server.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--kv-canary", default="log", choices=["none", "log", "raise"])
    parser.add_argument("--perturb", type=float, default=0.0, help="arm every self-test perturbation at this rate")
    parser.add_argument("--attention-backend", default="triton", choices=["triton", "flashinfer"])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--rates", nargs="+", default=["8", "32", "inf"])
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--mem-fraction", type=float, default=0.85)
    parser.add_argument("--max-total-tokens", type=int, default=0)
    parser.add_argument("--warmup-prompts", type=int, default=16,
                        help="a first bench_serving run at rate inf, not kept: kernels compiled before the timed rates")
    parser.add_argument("--start-limit-s", type=float, default=420)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--models", default=os.environ.get("SGLANG_SERVER_MODELS", "/tmp/sglang-server/models"))
    args = parser.parse_args()
    env = dict(os.environ, SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS=os.environ.get(
        "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "100"))
    if args.perturb:
        env.update(SGLANG_KV_CANARY_PERTURB=f"all={args.perturb}", SGLANG_KV_CANARY_PERTURB_SEED=str(args.seed))
    model = write_model("llama3-8b", Path(args.models))
    write_tokenizer(model, LLAMA3_8B["vocab_size"])
    result = {"argv": sys.argv[1:], **which_sglang(), "kind": "http", "kv_canary": args.kv_canary,
              "perturb": args.perturb, "attention": args.attention_backend, "rates": []}
    t0 = time.perf_counter()
    server = subprocess.Popen(server_command(args, model), env=env, stdout=sys.stderr, start_new_session=True)
    try:
        import sglang.bench_serving  # noqa: F401  (its imports while the server starts)

        wait_ready(server, args.port, args.start_limit_s)
        result["server_start_s"] = round(time.perf_counter() - t0, 1)
        if args.warmup_prompts:
            bench(args, model, "inf", args.warmup_prompts, args.seed + 1000, args.out.with_suffix(".warmup.jsonl"),
                  "warmup")
        for i, rate in enumerate(args.rates):
            result["rates"].append(bench(args, model, rate, args.num_prompts, args.seed + i,
                                         args.out.with_suffix(f".{i}.jsonl"), f"rate {rate}"))
        result["ok"] = True
    except Exception as exc:  # the report shows the failure; gpu.sh goes on with the next run
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    finally:
        result["server_exit"] = stop(server)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
