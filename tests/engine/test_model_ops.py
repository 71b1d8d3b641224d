"""bench/engine/model_ops.py counts a decode forward's ops on both engine paths, in its tiny smoke configuration."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "engine" / "model_ops.py"


@pytest.fixture(scope="module")
def model_ops(refsgl):  # refsgl: the pristine engine is importable, as the script imports it
    spec = importlib.util.spec_from_file_location("bench_model_ops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_smoke_run_counts_the_fused_layers(model_ops, tmp_path):
    rows = model_ops.main(["--smoke", "--layouts", "mha", "mla", "--out", str(tmp_path / "ops")])
    by_key = {(r["layout"], r["path"]): r for r in rows}
    assert set(by_key) == {("mha", "cuda"), ("mha", "cpu"), ("mla", "cuda"), ("mla", "cpu")}
    layers = model_ops.SMOKE_SHAPE["num_hidden_layers"]
    for layout in ("mha", "mla"):
        cuda, cpu = by_key[layout, "cuda"], by_key[layout, "cpu"]
        ops = cuda["model_by_name"]
        # Per layer one fused norm before attention and one after (plus the final norm), one rotary launch,
        # one merged input projection + o_proj + the MLP's two matmuls (plus the LM head).
        assert ops["triton::_rmsnorm_kernel"] == 2 * layers + 1
        assert ops["triton::_rotary_neox_kernel"] == layers
        assert ops["aten::linear"] == 4 * layers + 1
        assert cuda["host_reads"] == 0  # the CUDA path is captured in a graph: no host read may sit in it
        assert any(name.startswith("triton::") for name in cuda["attention_by_name"])
        # The torch path does the same work in many more ops (and never launches Triton).
        assert cpu["model_ops"] > 2 * cuda["model_ops"]
        assert not any(name.startswith("triton::") for name in {**cpu["model_by_name"], **cpu["attention_by_name"]})
        assert cuda["per_layer"] == round(cuda["model_ops"] / layers, 1)

    saved = json.loads((tmp_path / "ops.json").read_text())
    assert saved["rows"] == rows and saved["meta"]["shape"] == model_ops.SMOKE_SHAPE
    table = (tmp_path / "ops.md").read_text()
    assert f"| mha | cuda (triton) | {by_key['mha', 'cuda']['model_ops']} |" in table


def test_ops_are_told_from_views():
    """A view makes no kernel; a call whose children copy or compute does (e.g. `reshape` of a strided tensor)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    spec = importlib.util.spec_from_file_location("bench_model_ops_views", SCRIPT)
    model_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_ops)
    x = torch.randn(4, 6)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(model_ops.DECODE_SPAN):
            x.view(6, 4)  # a view
            x[:, :3].reshape(12)  # a copy (strided)
            x.reshape(24)  # a view
            torch.add(x, 1)  # compute
        torch.mul(x, 2)  # outside the forward
    counted = model_ops.count_ops(prof.events())
    assert counted["model_by_name"] == {"aten::reshape": 1, "aten::add": 1}
    assert counted["attention_ops"] == 0 and counted["host_reads"] == 0
