"""`canary-instrument demo` after a plain (non-editable) install: the engine ships inside the wheel."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _source_tree(dest: Path) -> Path:
    """The repository's files as a fresh checkout would have them (no build leftovers)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True,
    )
    if listed.returncode != 0:
        pytest.skip("needs a git checkout to build a clean source tree")
    for name in listed.stdout.splitlines():
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_demo_runs_from_a_plain_install(tmp_path):
    source = _source_tree(tmp_path / "src")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site),
         str(source)],
        check=True, capture_output=True,
    )
    assert (site / "canary_instrument/_engine/refsgl/srt/model_executor/model_runner.py").is_file()
    env = dict(os.environ, PYTHONPATH=str(site))
    run = subprocess.run(
        [sys.executable, "-m", "canary_instrument", "demo", "--layout", "mha", "--clean-steps", "5", "--no-overhead"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Result: 28/28 injected faults caught; 0 violations" in run.stdout
    # The HiCache section: the runtime followed the engine's host pool, found by structure in the installed copy.
    assert "mha    on " in run.stdout and "(MHATokenToKVPoolHost)" in run.stdout
