"""The perturbation soak (bench/runtime/soak.py) as a CPU smoke run: a short soak on a CLI-instrumented engine
copy (a status snapshot every 3 steps) writes its JSON and Markdown, every applied injection is accounted for,
and the clean run reports nothing."""

import json
import subprocess
import sys
from pathlib import Path

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
    assert score["injected"] >= 5 and score["unattributed"] == [] and perturbed["misses"]["undetected"] == []
    # Every miss is explained: its slot was rewritten or freed before anything could read it.
    assert score["injected"] - score["reported"] == len(perturbed["misses"]["overwritten"]) + len(
        perturbed["misses"]["unreachable"])
    assert clean["violations"] == 0 and "score" not in clean
    assert "sweep_passes=" in perturbed["stats"] and "swept=0 " not in perturbed["stats"]
    markdown = (tmp_path / "smoke.md").read_text()
    assert markdown.startswith("# Perturbation soak on ") and "| next_token_swap |" in markdown
