"""The command line as a user drives it: exit codes, output formats, --diff/--check, catalog errors, start-up imports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from canary_instrument import __version__
from canary_instrument.cli import main

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "golden" / "engine"
FINDING = re.compile(r"^.+:\d+:\d+: CI\d{3} .+$")


@pytest.fixture
def engine(tmp_path) -> Path:
    root = tmp_path / "engine"
    shutil.copytree(ENGINE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.py"))}


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_the_whole_flow_and_its_exit_codes(engine):
    pristine = invoke("check", engine)
    assert pristine.exit_code == 1
    lines = pristine.output.splitlines()
    assert all(FINDING.match(line) for line in lines[:-1]) and len(lines) == 8
    assert lines[-1].startswith("Found 7 findings")

    assert invoke("scaffold", engine).exit_code == 0
    clean = invoke("check", engine)
    assert (clean.exit_code, clean.output) == (0, "")  # quiet on success

    assert invoke("apply", "--check", engine).exit_code == 1
    applied = invoke("apply", engine)
    assert applied.exit_code == 0 and "5 files applied." in applied.output
    assert invoke("apply", "--check", engine).exit_code == 0
    assert invoke("check", engine).exit_code == 0
    assert invoke("revert", engine).exit_code == 0
    assert invoke("check", engine).exit_code == 0


def test_diff_prints_a_unified_diff_and_writes_nothing(engine):
    before = tree_bytes(engine)
    result = invoke("scaffold", "--diff", engine)
    assert result.exit_code == 0
    assert "+        canary_ctx = contextlib.nullcontext()" in result.output
    assert result.output.count("--- a/") == 4
    assert tree_bytes(engine) == before


def test_json_and_github_formats(engine):
    result = invoke("check", "--format", "json", engine)
    document = json.loads(result.output)
    assert result.exit_code == 1 and document["exit_code"] == 1
    assert {f["code"] for f in document["findings"]} == {"CI101"} and len(document["findings"]) == 7
    assert set(document["findings"][0]) == {"path", "line", "col", "code", "message"}

    result = invoke("check", "--format", "github", engine)
    lines = result.output.splitlines()
    assert len(lines) == 7
    assert all(re.match(r"^::error file=.+,line=\d+,col=\d+,title=CI101::.+", line) for line in lines)


def test_a_malformed_catalog_is_exit_2_naming_the_field(engine, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[sites]]\nrole = "capture"\nshape = "around"\n')
    result = invoke("check", "--catalog", bad, engine)
    assert result.exit_code == 2
    assert "sites[role=capture].shape" in result.output and "Traceback" not in result.output


def test_path_defaults_to_the_current_directory(engine, monkeypatch):
    monkeypatch.chdir(engine)
    assert invoke("check").exit_code == 1
    assert invoke("scaffold").exit_code == 0
    assert invoke("check").exit_code == 0


def test_help_lists_every_command_including_the_lazily_loaded_ones():
    result = invoke("--help")
    assert result.exit_code == 0
    for name in ("scaffold", "check", "apply", "revert", "build-kernels", "demo"):
        assert re.search(rf"^  {name}\b", result.output, re.MULTILINE), name


def test_check_imports_neither_libcst_nor_torch_nor_jinja(engine):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "canary_instrument", "check", str(engine)],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "click" in imported
    assert not imported & {"libcst", "torch", "triton", "jinja2", "numpy"}


def test_a_no_op_apply_does_not_import_libcst(engine):
    assert invoke("scaffold", engine).exit_code == 0
    assert invoke("apply", engine).exit_code == 0
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "canary_instrument", "apply", str(engine)],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "libcst" not in proc.stderr


@pytest.mark.parametrize("output_format", ["text", "json", "github"])
def test_the_console_script_prints_checks_whole_result_and_its_exit_code_through_a_pipe(engine, output_format):
    # What the console script prints must all reach a reader of the pipe, and the exit code be check's,
    # as when it runs in this process.
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "canary_instrument", "check", "--no-cache", "--format", output_format, str(engine)],
        capture_output=True, text=True, env=env,
    )
    in_process = invoke("check", "--no-cache", "--format", output_format, engine)
    assert proc.returncode == in_process.exit_code == 1
    assert proc.stdout == in_process.output and proc.stdout.endswith("\n") and proc.stderr == ""
