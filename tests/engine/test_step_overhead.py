"""bench/runtime/step_overhead.py runs end to end and reports which forwards each timed decode step replayed
from CUDA graphs and which it ran eagerly (on CUDA, an EAGLE step replays all three graphs and nothing else)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "runtime" / "step_overhead.py"


@pytest.fixture(scope="module")
def step_overhead():
    pytest.importorskip("libcst")  # instrumenting the engine copy runs the CLI
    spec = importlib.util.spec_from_file_location("bench_step_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def run(module, tmp_path, *args) -> dict:
    out = tmp_path / "overhead.json"
    module.main(["--bs", "2", "--subs", "1", "3", "--steps", "4", "--warmup", "2", "--profile-steps", "2",
                 "--out", str(out), *args])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["bs"], r["sub_forwards"]) for r in rows] == [(2, 1), (2, 3)]
    assert (tmp_path / "overhead.md").read_text().count("\n| 2 |") == 2
    return {r["sub_forwards"]: r for r in rows}


def test_cpu_steps_run_every_forward_eagerly(step_overhead, tmp_path):
    rows = run(step_overhead, tmp_path, "--device", "cpu")
    # Plain decode: one forward; EAGLE with 3 draft forwards: those, the target verify and the draft-extend.
    assert rows[1]["graph_replays_per_step"] == {} and rows[1]["eager_forwards_per_step"] == 1
    assert rows[3]["graph_replays_per_step"] == {} and rows[3]["eager_forwards_per_step"] == 5
    assert all(r["on_bracket_us"] > 0 and r["on_total_us"] > 0 for r in rows.values())


@pytest.mark.gpu
def test_cuda_steps_replay_decode_verify_draft_chain_and_draft_extend_from_graphs(step_overhead, tmp_path):
    rows = run(step_overhead, tmp_path, "--device", "cuda")
    assert rows[1]["graph_replays_per_step"] == {"target": 1} and rows[1]["eager_forwards_per_step"] == 0
    assert rows[3]["graph_replays_per_step"] == {"target": 1, "draft": 1, "draft_extend": 1}
    assert rows[3]["eager_forwards_per_step"] == 0
    assert all(r["on_bracket_us"] == 0 for r in rows.values())  # no bracket host work outside a capture
