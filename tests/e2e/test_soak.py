"""The perturbation soak (bench/runtime/soak.py) as a CPU smoke run: a short soak on a CLI-instrumented engine
copy (a status snapshot every 3 steps) writes its JSON and Markdown, every applied injection is accounted for,
and the clean run reports nothing; the soak's drain sweeps the cache whatever step serving ended on."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from canary_instrument.demo import matrix
from canary_instrument.runtime.perturb import score

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_scores_injections_and_a_clean_run(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "runtime" / "soak.py"), "--layouts", "swa", "--steps", "60",
               "--rate", "0.1", "--warmup", "5", "--sweep-interval", "2", "--readback-interval", "3",
               "--out", str(tmp_path), "--name", "smoke"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert report["ok"] and report["device"] and "bench/runtime/soak.py --layouts swa --steps 60" in report["command"]
    assert report["settings"]["readback_interval"] == 3
    perturbed, clean = report["layouts"]["swa"]["perturbed"], report["layouts"]["swa"]["clean"]
    score = perturbed["score"]
    assert score["injected"] >= 5 and score["unattributed"] == 0 and perturbed["misses"]["undetected"] == []
    # Every miss is explained: its slot was rewritten or freed before anything could read it.
    assert score["injected"] - score["reported"] == len(perturbed["misses"]["overwritten"]) + len(
        perturbed["misses"]["unreachable"])
    assert clean["violations"] == 0 and "score" not in clean
    assert "sweep_passes=" in perturbed["stats"] and "swept=0 " not in perturbed["stats"]
    markdown = (tmp_path / "smoke.md").read_text()
    assert markdown.startswith("# Perturbation soak on ") and "| next_token_swap |" in markdown


def load_soak():
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "runtime" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_drain_sweeps_a_flip_in_a_requests_final_forward(engine_module, monkeypatch):
    """The GPU soak's one 'undetected' miss (soak_h100_swa: a real_kv_post_forward flip in the last step, 2026):
    a flip in a request's final forward stays in the cache, where only the sweep reads it. The drain must sweep
    whatever step serving ended on, not only when it ended on a multiple of the sweep interval."""
    soak = load_soak()
    interval, forwards = 4, 7  # the request's forwards end on step 7, not a multiple of the interval
    # Only the final forward is perturbed: one flip in the SWA group of the slot it has just written.
    for var, value in {"SGLANG_KV_CANARY_PERTURB": "real_kv_post_forward=1", "SGLANG_KV_CANARY_PERTURB_SEED": "3",
                       "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": str(forwards - 1),
                       "SGLANG_KV_CANARY_PERTURB_TARGET_GROUP": "swa"}.items():
        monkeypatch.setenv(var, value)
    bench = matrix.EngineBench(engine_module, matrix.Variant("swa", False), kv_canary_sweep_interval=interval)
    engine, manager = bench.engine, bench.engine.model_runner.canary_manager
    engine.scheduler.add_request(list(range(1, 21)), max_new_tokens=forwards)  # one prefill, then 6 decodes
    soak.drain_and_sweep(engine, manager)
    violations = manager.flush()
    result = score(manager.perturber.drain(), violations)
    assert manager.step == forwards and result.injected == 1, result.format()
    assert result.reported == 1 and result.unattributed == [], result.format()
