"""bench/engine/step_floor.py runs end to end in its CPU smoke configuration and reports what it measured."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "engine" / "step_floor.py"


@pytest.fixture(scope="module")
def step_floor():
    spec = importlib.util.spec_from_file_location("bench_step_floor", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_smoke_run_writes_both_tables(step_floor, tmp_path):
    pytest.importorskip("libcst")  # instrumenting the engine runs the CLI (a dependency; absent on bare GPU boxes)
    assert step_floor.main(["--smoke", "--out", str(tmp_path), "--engine-dir", str(tmp_path / "engine")]) == 0
    report = json.loads((tmp_path / "step_floor_smoke.json").read_text())
    bandwidth = report["copy_bandwidth_Bps"]

    (llama,) = report["llama"]
    assert (llama["requests"], llama["context"]) == (2, 40)
    assert llama["kv_bytes"] == 2 * 40 * 32 * 8 * 128 * 2 * 2  # Llama-3-8B: 128 KiB of KV per token
    assert llama["floor_us"] == pytest.approx((16e9 + llama["kv_bytes"]) / bandwidth * 1e6, rel=1e-3)
    assert llama["canary_device_us"] > 0 and llama["canary_host_us"] > 0
    assert llama["canary_total_us"] == pytest.approx(llama["canary_device_us"] + llama["canary_host_us"], abs=0.02)
    assert llama["verified"] > 0 and llama["violations"] == 0

    (engine,) = report["engine"]
    assert engine["violations"] == 0
    assert engine["step_off_ms"] > 0 and engine["step_on_ms"] > 0
    assert engine["floor_ms"] == pytest.approx(
        (engine["weight_bytes"] + engine["kv_bytes_per_step"]) / bandwidth * 1e3, rel=1e-2, abs=1e-3)

    text = (tmp_path / "step_floor_smoke.md").read_text()
    assert "(a) Llama-3-8B decode step" in text and "(b) The reference engine's own decode step" in text
    assert "| 2 x 40 |" in text


def test_missing_engine_without_libcst_says_how_to_prepare_it(step_floor, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "libcst", None)  # `import libcst` now raises ImportError
    with pytest.raises(SystemExit, match="--prepare-engine"):
        step_floor.instrumented_engine(tmp_path / "nowhere")


def test_bad_shape_is_refused(step_floor):
    with pytest.raises(SystemExit, match="REQUESTSxCONTEXT"):
        step_floor.parse_shapes(["8by4096"])
