"""`canary-instrument demo` as a user runs it, plus the engine-copy helpers it is built from."""

import re
from pathlib import Path

import pytest
import torch
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
    assert "scaffold  exit 0: 4 files" in out and "apply     exit 0: 5 files" in out
    matrix_header = next(line for line in out.splitlines() if line.strip().startswith("fault "))
    assert matrix_header.split()[1:] == ["swa", "swa+eagle"]
    eagle_row = next(line for line in out.splitlines() if "EAGLE draft position off by one" in line)
    # n/a without EAGLE; with it caught as a token mismatch by a later draft forward.
    delay, reason = eagle_row.split()[-2:]
    assert re.fullmatch(r"\+[1-9][0-9]*(\.\.[0-9]+)?", delay) and reason == "token"
    swap_row = next(line for line in out.splitlines() if "two requests' tokens swapped" in line)
    assert swap_row.split()[-4:] == ["+0", "token", "+0", "token"]  # caught on the step, with and without EAGLE
    idle_row = next(line for line in out.splitlines() if "cached KV bit flipped while idle" in line)
    assert idle_row.split()[-1] == "fingerprint"  # found by the idle-cache sweep
    for title, reason in (("fingerprint zeroed, KV flipped", "unwritten"), ("row token bit 32-63 flipped", "row_bits"),
                          ("KV bit flipped in any layer", "fingerprint")):
        row = next(line for line in out.splitlines() if title in line)
        assert row.split()[-1].rstrip("+") == reason
    for title, reason in (("two requests' rows swapped", "identity"), ("KV written to a wrong slot", "write_slot"),
                          ("slot freed while read", "freed")):
        row = next(line for line in out.splitlines() if title in line)
        assert row.split()[-4:] == ["+0", reason, "+0", reason]  # the request-side checks, on the step
    mixed_row = next(line for line in out.splitlines() if "wrong input token, mixed batch" in line)
    # The token oracle, on the step; the reference engine runs no mixed batches with EAGLE.
    assert mixed_row.split()[-3:] == ["+0", "oracle", "n/a"]
    for title in ("HiCache host copy corrupted", "HiCache load to wrong slots"):
        row = next(line for line in out.splitlines() if line.strip().startswith(title))
        assert row.split()[-2:] == ["refused", "n/a"]  # the runtime refuses SWA; no host tier with EAGLE
    assert "refused: the runtime refuses HiCache of an SWA pool at attach (kv canary: HiCache of the SWA pool" in out
    assert "swa: refused at attach" in out
    if torch.cuda.is_available():
        assert "jitter off" in out and "stream wait restored" in out
    else:
        assert "5. Timing jitter" in out and "not run: needs CUDA streams (no CUDA device here)" in out
    assert "MISSED" not in out
    assert "Result: 28/28 injected faults caught; 0 violations" in out
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


SITE_FILES = (
    "refsgl/srt/model_executor/model_runner.py",
    "refsgl/srt/model_executor/cuda_graph_runner.py",
    "refsgl/srt/speculative/eagle_worker_v2.py",
    "refsgl/srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
)


def test_pristine_engine_is_found_and_has_no_canary_wiring():
    root = engine_copy.pristine_engine_dir()
    wiring = re.compile(r"canary_(ctx|outside_ctx|index_ctx|manager|context)|install_canary|mark_init_finished")
    for name in SITE_FILES:
        found = wiring.search(Path(root, name).read_text())
        assert found is None, f"{name} must be pristine (scaffold inserts the sites), found {found.group()}"


def test_the_committed_gpu_overhead_figure_is_read_for_the_demo(tmp_path):
    from canary_instrument.demo.overhead import COMMITTED_GPU_RESULT, committed_gpu_overhead

    committed = committed_gpu_overhead()
    assert COMMITTED_GPU_RESULT.is_file() and committed is not None
    assert committed.device and committed.rows
    assert all(line.count("canary ") == 1 and "% of the step's floor" in line for line in committed.lines())
    assert (COMMITTED_GPU_RESULT.parent / committed.page).is_file()
    assert committed_gpu_overhead(tmp_path / "missing.json") is None  # e.g. an installed package: no bench/
