"""Generated kernel lines map back to the template lines they came from, and errors say so."""

import shutil
from pathlib import Path

import pytest

from canary_instrument.codegen.build import render_kernels
from canary_instrument.codegen.linemap import template_location
from canary_instrument.codegen.specs import every_spec

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"


def _template_line(where: str) -> str:
    name, line = where.rsplit(":", 1)
    return (REPO / name).read_text().splitlines()[int(line) - 1]


@pytest.mark.parametrize("spec", every_spec(), ids=lambda s: s.stem)
def test_every_code_line_maps_to_a_template_line_with_the_same_text(spec):
    generated = REPO / "kernels" / spec.filename
    lines = generated.read_text().splitlines()
    checked = 0
    for number, line in enumerate(lines, 1):
        code = line.strip()
        if not code or "{{" in code or line.startswith("# "):
            continue
        where = template_location(str(generated), number)
        assert where is not None, f"{spec.filename}:{number} has no template line"
        source = _template_line(where)
        if "{{" not in source and "{%" not in source:
            assert source.strip() == code, f"{spec.filename}:{number} -> {where}"
            checked += 1
    assert checked > {"canary": 200, "sweep": 80, "jitter": 30}[spec.family]


def test_error_inside_generated_kernel_points_to_template_line(tmp_path):
    pytest.importorskip("triton")
    import torch

    from canary_instrument.runtime.passes.triton_ops import TritonCanaryOps
    from tests.kernels.scenario import make_scenario

    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    path = templates / "canary.py.jinja"
    lines = path.read_text().splitlines(keepends=True)
    anchor = next(i for i, line in enumerate(lines) if "def _report(" in line)
    lines.insert(anchor + 2, "    bad = reasons != not_defined_anywhere\n")
    path.write_text("".join(lines))
    out = tmp_path / "kernels"
    render_kernels(templates, out)

    sc = make_scenario("mha", "none", seed=1, device="cuda" if torch.cuda.is_available() else "cpu")
    ops = TritonCanaryOps(block=16, programs=2, kernel_dir=out)
    with pytest.raises(Exception) as info:
        ops.pre_forward(sc.state, sc.plan, sc.input_ids)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"is generated from templates/canary.py.jinja:{anchor + 3}" in notes, (notes, info.value)
