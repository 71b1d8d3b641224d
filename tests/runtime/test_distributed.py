"""Cross-rank verdicts through torch.distributed: two real processes (gloo on CPU; NCCL with 2 GPUs)."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dist_worker.py")
RELEASE_WORKER = os.path.join(HERE, "gloo_release_worker.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(scenario, backend="gloo", device="cpu"):
    port = _free_port()
    env = dict(os.environ, KV_CANARY_BACKEND=os.environ.get("KV_CANARY_BACKEND", "torch"))
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(rank), "2", str(port), backend, device],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            raise AssertionError(f"rank exited {proc.returncode}:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def _check_raise_on_one_rank(results):
    rank0, rank1 = results
    # Rank 1 found violations at step 2 and read them from its published words at the end of step 2 (on
    # CPU a pass has published by then); both ranks raise at the shared check of that step.
    assert rank1["error"] == "CanaryViolationError" and rank1["local_violations"] > 0
    assert "kv_canary violation:" in rank1["message"]
    assert rank0["error"] == "CanaryViolationError" and rank0["local_violations"] == 0
    assert "violations on rank(s) [1]" in rank0["message"]
    assert rank0["error_step"] == rank1["error_step"] == 2


def _check_health(results):
    rank0, rank1 = results
    assert rank1["error"] == rank0["error"] == "CanaryHealthError"
    assert "rank(s) [1]" in rank0["message"]
    assert rank0["error_step"] == rank1["error_step"] == 4


def test_a_violation_on_one_rank_is_raised_on_every_rank():
    _check_raise_on_one_rank(_run("raise_on_one_rank"))


def test_a_lost_kernel_on_one_rank_fails_the_health_check_everywhere():
    _check_health(_run("health"))


def test_log_mode_reports_combined_counts_from_one_rank():
    rank0, rank1 = _run("log_counts")
    assert rank0["error"] is None and rank1["error"] is None
    assert rank1["rank_lines"] == []  # one rank reports for all
    last = rank0["rank_lines"][-1]
    assert "ranks=2" in last and f"violations={rank1['local_violations']}" in last
    assert rank1["local_violations"] > 0


def test_ranks_with_different_warm_up_still_check_at_the_same_steps():
    rank0, rank1 = _run("uneven_warmup")
    assert rank0["error"] is None and rank1["error"] is None
    # Steps count from init on every rank, so the checks pair up at steps 2, 4 and 6.
    assert [line.split()[2] for line in rank0["rank_lines"]] == ["step=2", "step=4", "step=6"]
    assert all("ranks=2 violations=0" in line for line in rank0["rank_lines"])


def test_combine_returns_only_after_gloo_has_released_its_tensors():
    # A gloo worker thread that drops the last C++ reference after the interpreter began to
    # finalize aborts the process (rank exited -6). The script makes that late release certain.
    proc = subprocess.run([sys.executable, RELEASE_WORKER], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["demoted"] == 2 and result["handed_over"] == 2
    assert result["reports"] == [[0, 3, True, 7]]
    assert result["still_held"] == 0


two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices for NCCL"
)


@pytest.mark.gpu
@two_gpus
def test_nccl_two_gpus_raise_on_one_rank():
    _check_raise_on_one_rank(_run("raise_on_one_rank", backend="nccl", device="cuda"))


@pytest.mark.gpu
@two_gpus
def test_nccl_two_gpus_health():
    _check_health(_run("health", backend="nccl", device="cuda"))
