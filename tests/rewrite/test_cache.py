"""check's cache: a warm run examines no unchanged file, gives exactly what a cold run gives, follows every edit
and every catalog change, and is written atomically."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite import scan as scan_module
from canary_instrument.rewrite.io import cache as cache_module
from canary_instrument.rewrite.io.cache import FOLDER, CheckCache
from canary_instrument.rewrite.check import check_tree

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "golden" / "engine"
CG = "refsgl/srt/model_executor/cuda_graph_runner.py"
PIECEWISE = """import contextlib


class PiecewiseRunner:
    def run(self, forward_batch):
        return self.piecewise_graph_runner.replay(forward_batch)
"""


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """Keep any fallback cache out of the real home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CANARY_INSTRUMENT_CACHE_DIR", raising=False)


@pytest.fixture
def engine(tmp_path) -> Path:
    root = tmp_path / "engine"
    shutil.copytree(ENGINE, root, ignore=shutil.ignore_patterns("__pycache__"))
    age(root)
    return root


def age(root: Path, seconds: float = 3600) -> None:
    """Date every file an hour back, as in a checkout nobody is editing this second."""
    past = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (past, past))


def run(root: Path, cache_dir: Path, counter: list | None = None):
    catalog = load_catalog(root)
    cache = CheckCache.open([root], catalog, cache_dir)
    assert cache.enabled
    return check_tree([root], catalog, cache=cache)


def outcome(result):
    return [str(f) for f in result.findings], [str(e) for e in result.errors], result.files_seen


@pytest.fixture
def examined(monkeypatch) -> list:
    """Files the check examined (what the rules need of it, from its bytes): those the cache does not vouch for."""
    seen = []
    original = scan_module.Prefilter.needs

    def spy(self, posix, data):
        seen.append(os.path.basename(posix))
        return original(self, posix, data)

    monkeypatch.setattr(scan_module.Prefilter, "needs", spy)
    return seen


def test_a_warm_run_reads_no_unchanged_file_and_reports_the_same(engine, tmp_path, examined):
    (engine / "refsgl/srt/model_executor/piecewise_runner.py").write_text(PIECEWISE)
    age(engine)
    cold = run(engine, tmp_path / "cache")
    assert cold.exit_code == 1 and {f.code for f in cold.findings} == {"CI101", "CI301"}
    assert len(examined) == cold.files_seen
    examined.clear()
    warm = run(engine, tmp_path / "cache")
    assert outcome(warm) == outcome(cold)
    assert examined == []


def test_an_edited_file_is_read_again_and_its_findings_follow(engine, tmp_path, examined):
    run(engine, tmp_path / "cache")
    examined.clear()
    path = engine / "refsgl/srt/model_executor/piecewise_runner.py"
    path.write_text(PIECEWISE)
    warm = run(engine, tmp_path / "cache")
    assert examined == ["piecewise_runner.py"]
    assert [f.code for f in warm.findings if f.path == path] == ["CI301"]
    path.unlink()
    again = run(engine, tmp_path / "cache")
    assert all(f.path != path for f in again.findings)


def test_an_edit_in_the_same_tick_as_the_last_run_is_not_missed(engine, tmp_path):
    path = engine / CG
    path.write_text(path.read_text())  # modified just now
    before = os.stat(path)
    assert run(engine, tmp_path / "cache").findings[0].code == "CI101"
    # Same size and mtime, other bytes: only the recency of the mtime gives the edit away.
    text = path.read_text()
    path.write_text(text.replace("def _capture(", "def _captur_("))  # the capture site is gone
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    fresh = check_tree([engine], load_catalog(engine))
    assert outcome(run(engine, tmp_path / "cache")) == outcome(fresh)
    assert "CI102" in {f.code for f in fresh.findings}


def test_a_truncated_or_foreign_cache_is_ignored_and_replaced(engine, tmp_path):
    cold = run(engine, tmp_path / "cache")
    [file] = (tmp_path / "cache").glob("check-*.pickle")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    assert outcome(run(engine, tmp_path / "cache")) == outcome(cold)
    file.write_bytes(b"not a cache")
    assert outcome(run(engine, tmp_path / "cache")) == outcome(cold)
    file.write_bytes(pickle.dumps((0, 0, {}, None)))  # another build's format
    assert outcome(run(engine, tmp_path / "cache")) == outcome(cold)
    cache = CheckCache.open([engine], load_catalog(engine), tmp_path / "cache")
    assert len(cache.entries) == cold.files_seen  # written again, and trusted again


def test_the_cache_is_written_atomically(engine, tmp_path, monkeypatch):
    run(engine, tmp_path / "cache")
    [file] = (tmp_path / "cache").glob("check-*.pickle")
    before = file.read_bytes()
    (engine / CG).write_text((engine / CG).read_text() + "\n# edited\n")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_module.pickle, "dump", fail)
    assert run(engine, tmp_path / "cache").exit_code == 1  # the check itself is unaffected
    assert file.read_bytes() == before  # the old cache stays whole ...
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".gitignore", "CACHEDIR.TAG", file.name]


def test_nothing_is_written_when_nothing_changed(engine, tmp_path):
    run(engine, tmp_path / "cache")
    [file] = (tmp_path / "cache").glob("check-*.pickle")
    past = time.time() - 60
    os.utime(file, (past, past))
    stamp = file.stat().st_mtime_ns
    run(engine, tmp_path / "cache")
    assert file.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".gitignore", "CACHEDIR.TAG", file.name]
    assert (tmp_path / "cache" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_another_catalog_gets_its_own_cache(engine, tmp_path):
    run(engine, tmp_path / "cache")
    overlay = tmp_path / "overlay.toml"
    overlay.write_text('[[triggers]]\ncalls = ["*.run"]\nwhat = "runner call"\n')
    catalog = load_catalog(engine, overlay)
    cache = CheckCache.open([engine], catalog, tmp_path / "cache")
    assert cache.entries == {}
    assert len(list((tmp_path / "cache").glob("check-*.pickle"))) == 1


def cli(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "canary_instrument", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_cli_caches_at_the_git_root_and_no_cache_writes_nothing(engine, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(["git", "init", "-q"], cwd=engine, check=True)
    none = cli("check", "--no-cache", "refsgl", cwd=engine, env=env)
    assert not (engine / FOLDER).exists()
    first = cli("check", "refsgl", cwd=engine, env=env)
    assert (engine / FOLDER / ".gitignore").is_file()
    second = cli("check", "refsgl", cwd=engine, env=env)
    assert first.stdout == second.stdout == none.stdout and first.returncode == second.returncode == 1
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=engine,
                            capture_output=True, text=True, check=True).stdout
    assert FOLDER not in status  # the folder ignores itself


@pytest.fixture
def forward_tree(tmp_path):
    """A model runner whose eager runner's forward path the caller search follows into other files."""
    from test_uncovered import EAGER, MODEL_RUNNER

    from rewrite_trees import Tree

    tree = Tree(tmp_path / "engine")
    tree.write({
        "pkg/__init__.py": "",
        "pkg/srt/model_executor/model_runner.py": MODEL_RUNNER,
        "pkg/srt/runners/eager.py": EAGER,
        "pkg/srt/tools/report.py": "def report(rows):\n    return len(rows)\n",
    })
    age(tree.root)
    return tree


def ci301(result):
    return [(f.path.name, f.line) for f in result.findings if f.code == "CI301"]


def cold_outcome(root):
    cold = check_tree([root], load_catalog(root))
    return outcome(cold), cold.files_analysed


def test_an_edited_file_that_now_calls_into_a_forward_path_is_found_without_a_cold_run(forward_tree, tmp_path,
                                                                                       examined):
    tree = forward_tree
    assert ci301(run(tree.root, tmp_path / "cache")) == []
    examined.clear()
    tool = tree.root / "pkg/srt/tools/report.py"
    tool.write_text("def report(rows):\n    return len(rows) + 1\n")
    assert ci301(run(tree.root, tmp_path / "cache")) == []
    assert examined == ["report.py"]
    tool.write_text("from pkg.srt.runners.eager import EagerRunner\n\n\n"
                    "def report(runner: EagerRunner, batch):\n    return runner.execute(batch)\n")
    warm = run(tree.root, tmp_path / "cache")
    assert ci301(warm) == [("eager.py", 9)]
    assert (outcome(warm), warm.files_analysed) == cold_outcome(tree.root)


BENCH = ("from pkg.srt.runners.eager import EagerRunner\n\n\n"
         "def bench(runner: EagerRunner, batch):\n    return runner.execute(batch)\n")


def test_after_each_edit_a_warm_run_gives_a_cold_runs_outcome(forward_tree, tmp_path, examined):
    tree = forward_tree
    tree.write({"pkg/srt/tools/bench.py": BENCH})  # a caller the search finds
    age(tree.root)
    assert ci301(run(tree.root, tmp_path / "cache")) == [("eager.py", 9)]
    runner = tree.root / "pkg/srt/model_executor/model_runner.py"
    report = tree.root / "pkg/srt/tools/report.py"
    edits = [
        (runner, runner.read_text() + "\n\ndef describe(model_runner):\n    return type(model_runner).__name__\n"),
        (report, "def report(rows):\n    return len(rows) + 1\n"),
        (runner, runner.read_text() + "\n"),
    ]
    for path, text in edits:
        examined.clear()
        path.write_text(text)
        warm = run(tree.root, tmp_path / "cache")
        assert examined == [path.name]  # only the edited file is examined again
        assert (outcome(warm), warm.files_analysed) == cold_outcome(tree.root)


@pytest.mark.parametrize("edit", ["deleted", "no longer calling"])
def test_a_caller_found_before_and_changed_since_is_not_taken_from_the_cache(forward_tree, tmp_path, edit):
    tree = forward_tree
    bench = tree.root / "pkg/srt/tools/bench.py"
    tree.write({"pkg/srt/tools/bench.py": BENCH})
    age(tree.root)
    assert ci301(run(tree.root, tmp_path / "cache")) == [("eager.py", 9)]
    if edit == "deleted":
        bench.unlink()
    else:
        bench.write_text(BENCH.replace("runner.execute(batch)", "batch"))
    runner = tree.root / "pkg/srt/model_executor/model_runner.py"
    runner.write_text(runner.read_text() + "\n")
    warm = run(tree.root, tmp_path / "cache")
    assert ci301(warm) == [] and (outcome(warm), warm.files_analysed) == cold_outcome(tree.root)
