"""`canary-instrument demo` as a user runs it, plus the engine-copy helpers it is built from."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from canary_instrument.demo import engine_copy
from canary_instrument.demo.command import demo


def test_demo_instruments_runs_and_catches_every_fault(tmp_path):
    keep = tmp_path / "engine"
    result = CliRunner().invoke(
        demo, ["--layout", "swa", "--clean-steps", "8", "--no-overhead", "--keep", str(keep)]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "scaffold  exit 0: 4 files" in out and "apply     exit 0: 4 files" in out
    for fault_title in ("req_to_token entry remapped", "SWA mapping entry corrupted", "EAGLE draft position off by one"):
        line = next(line for line in out.splitlines() if line.strip().startswith(fault_title))
        assert "MISSED" not in line and "n/a" not in line
    assert "Result: 13/13 injected faults caught; 0 violations" in out
    assert (keep / "refsgl/srt/model_executor/model_runner.py").read_text().count("canary_ctx") >= 2


def test_demo_refuses_to_overwrite_a_kept_folder(tmp_path):
    result = CliRunner().invoke(demo, ["--keep", str(tmp_path)])
    assert result.exit_code == 2
    assert "the folder exists" in result.output


def test_instrument_reports_the_failing_command(tmp_path):
    root = engine_copy.copy_engine(tmp_path / "engine")
    broken = root / "refsgl/srt/model_executor/model_runner.py"
    broken.write_text(broken.read_text() + "\ndef broken(:\n")
    with pytest.raises(engine_copy.ToolFailed, match=r"scaffold exited 2"):
        engine_copy.instrument(root)


def test_diff_stat_counts_changed_lines_per_file():
    before = {"a.py": "x = 1\ny = 2\n", "b.py": "same\n"}
    after = {"a.py": "x = 1\ny = 3\nz = 4\n", "b.py": "same\n", "c.py": "new\n"}
    stats = {d.path: (d.added, d.removed) for d in engine_copy.diff_stat(before, after)}
    assert stats == {"a.py": (2, 1), "c.py": (1, 0)}


def test_pristine_engine_is_found_from_a_source_checkout():
    root = engine_copy.pristine_engine_dir()
    assert (root / "refsgl/srt/model_executor/model_runner.py").is_file()
    sources = "".join(p.read_text() for p in Path(root, "refsgl").rglob("*.py"))
    assert "canary" not in sources.replace("canary_token_ids", "")
