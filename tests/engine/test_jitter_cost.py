"""bench/runtime/jitter_cost.py runs end to end: with jitter off nothing is installed and no jitter point runs
or launches; with it on every decode step runs 4 + 2 x layers points (on a GPU: kernels the profiler sees)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from canary_instrument.demo import matrix

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "runtime" / "jitter_cost.py"
POINTS_PER_STEP = 4 + 2 * matrix.ENGINE_DEFAULTS["num_hidden_layers"]


@pytest.fixture(scope="module")
def jitter_cost():
    pytest.importorskip("libcst")  # instrumenting the engine copy runs the CLI
    spec = importlib.util.spec_from_file_location("bench_jitter_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_off_runs_no_jitter_and_on_runs_every_point_each_step(jitter_cost, tmp_path, device):
    out = tmp_path / "jitter.json"
    jitter_cost.main(["--device", device, "--bs", "2", "--steps", "3", "--warmup", "1", "--profile-steps", "1",
                      "--max-us", "0", "1", "--out", str(out)])
    off, on = json.loads(out.read_text())["rows"]
    assert (off["installed"], off["jitter_launches_per_step"], off["jitter_kernels_profiled_per_step"]) == (False, 0, 0)
    assert on["installed"] and on["jitter_launches_per_step"] == POINTS_PER_STEP
    if device == "cuda":
        assert on["jitter_kernels_profiled_per_step"] == POINTS_PER_STEP
    assert (tmp_path / "jitter.md").read_text().count("\n| 2 |") == 2
