"""build-kernels: fresh committed output, write-if-different, --check, headers, names, strictness."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from canary_instrument.codegen.build import render_kernels
from canary_instrument.codegen.command import build_kernels
from canary_instrument.codegen.render import KernelTemplateError
from canary_instrument.codegen.specs import all_specs, every_spec

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
KERNELS = REPO / "kernels"


def test_committed_kernels_are_fresh():
    result = render_kernels(TEMPLATES, KERNELS, check=True)
    assert result.stale == [], "kernels/ is stale; run `canary-instrument build-kernels` and commit"


def test_every_axis_in_the_name_and_header(tmp_path):
    render_kernels(TEMPLATES, tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len(all_specs()) == len(all_specs(family="sweep")) == 15
    assert len(manifest) == len(every_spec()) == 32  # 15 per-forward, 15 sweep, 2 jitter (one per clock)
    for spec in every_spec():
        text = (tmp_path / spec.filename).read_text()
        head = text.splitlines()[:4]
        assert f"templates/{spec.template}" in head[0]
        assert manifest[spec.filename]["template"] == spec.template
        assert spec.filename.startswith(f"{spec.family}_layout_" if spec.family != "jitter" else "jitter_clock_")
        assert head[1].startswith(f"# template: {spec.template} sha256:")
        assert head[2] == "# axes: " + " ".join(f"{k}={v}" for k, v in spec.axes.items())
        assert head[3] == f"# content-sha256: {manifest[spec.filename]['content_sha256']}"
        for axis, value in spec.axes.items():
            assert f"{axis}_{value}" in spec.filename
        compile(text, spec.filename, "exec")


def test_writes_only_files_that_differ(tmp_path):
    first = render_kernels(TEMPLATES, tmp_path)
    assert len(first.written) == 34  # 15 per-forward, 15 sweep and 2 jitter kernels + manifest + package init
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    target = tmp_path / all_specs()[0].filename
    target.write_text(target.read_text() + "# local edit\n")
    os.utime(target, ns=(1, 1))
    second = render_kernels(TEMPLATES, tmp_path)
    assert second.written == [target.name]
    for p in tmp_path.iterdir():
        if p != target:
            assert p.stat().st_mtime_ns == stamp[p.name], f"{p.name} was rewritten"
    assert render_kernels(TEMPLATES, tmp_path).written == []


def test_orphaned_kernel_files_are_stale_and_removed(tmp_path):
    render_kernels(TEMPLATES, tmp_path)
    orphans = [tmp_path / "canary_layout_gqa_v_half_1_realkv_none.py", tmp_path / "sweep_layout_gqa_v_half_0_realkv_all.py"]
    for orphan in orphans:
        orphan.write_text("# old axis\n")
    assert render_kernels(TEMPLATES, tmp_path, check=True).removed == [o.name for o in orphans]
    assert all(o.exists() for o in orphans)
    render_kernels(TEMPLATES, tmp_path)
    assert not any(o.exists() for o in orphans)


def test_check_flag_exit_codes(tmp_path):
    runner = CliRunner()
    args = ["--templates", str(TEMPLATES), "--out", str(tmp_path)]
    stale = runner.invoke(build_kernels, args + ["--check"])
    assert stale.exit_code == 1 and "stale" in stale.output
    assert not any(tmp_path.iterdir()), "--check must not write"
    assert runner.invoke(build_kernels, args).exit_code == 0
    assert runner.invoke(build_kernels, args + ["--check"]).exit_code == 0
    assert runner.invoke(build_kernels, args + ["--check", "--layout", "mla"]).exit_code == 0


def test_layout_option_limits_kernel_files(tmp_path):
    result = CliRunner().invoke(build_kernels, ["--templates", str(TEMPLATES), "--out", str(tmp_path), "--layout", "mla"])
    assert result.exit_code == 0
    assert sorted(p.name for p in tmp_path.glob("*_layout_*.py")) == sorted(s.filename for s in every_spec(["mla"]))


def _copy_templates(tmp_path) -> Path:
    dst = tmp_path / "templates"
    shutil.copytree(TEMPLATES, dst)
    return dst


def test_undefined_template_variable_fails_with_template_line(tmp_path):
    templates = _copy_templates(tmp_path)
    path = templates / "canary.py.jinja"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(30, "NOT_AN_AXIS = {{ not_an_axis }}\n")
    path.write_text("".join(lines))
    with pytest.raises(KernelTemplateError, match=r"canary\.py\.jinja:31: UndefinedError"):
        render_kernels(templates, tmp_path / "out")
    result = CliRunner().invoke(build_kernels, ["--templates", str(templates), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "canary.py.jinja:31" in result.output


def test_template_syntax_error_names_the_line(tmp_path):
    templates = _copy_templates(tmp_path)
    path = templates / "canary.py.jinja"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(40, "{% if %}\n")
    path.write_text("".join(lines))
    with pytest.raises(KernelTemplateError, match=r"canary\.py\.jinja:41: TemplateSyntaxError"):
        render_kernels(templates, tmp_path / "out")


def test_command_import_is_cheap():
    code = (
        "import sys; import canary_instrument.codegen.command; "
        "print(sorted(m for m in ('jinja2', 'torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert out.stdout.strip() == "[]"
