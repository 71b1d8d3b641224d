"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit in a temporary git repository.

The engine repository uses this repository as a hook source exactly as a user would
(`repo: <git url>`, `rev: <sha>`); pre-commit builds the hook's virtualenv from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "golden" / "engine"
MODEL_RUNNER = "refsgl/srt/model_executor/model_runner.py"
FINDING = re.compile(r"^(?P<path>\S+?):(?P<line>\d+):(?P<col>\d+): (?P<code>\S+) ", re.MULTILINE)
PRE_COMMIT = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or shutil.which("pre-commit")

pytestmark = pytest.mark.skipif(PRE_COMMIT is None, reason="the pre-commit package is not installed")


def git(*args: str, cwd: Path, env=None, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false",
         *args],
        cwd=cwd, env=env, check=check, capture_output=True, text=True,
    )


def tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "canary_instrument", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def hook_source(tmp_path_factory) -> tuple[Path, str]:
    """A committed snapshot of this working tree: what a user's pre-commit would clone."""
    source = tmp_path_factory.mktemp("hook-source")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    git("init", "-q", cwd=source)
    git("add", "-A", cwd=source)
    git("commit", "-qm", "snapshot", cwd=source)
    return source, git("rev-parse", "HEAD", cwd=source).stdout.strip()


@pytest.fixture(scope="module")
def pre_commit_env(tmp_path_factory) -> dict[str, str]:
    """One PRE_COMMIT_HOME for the module, so the hook virtualenv is built once."""
    env = dict(os.environ)
    env["PRE_COMMIT_HOME"] = str(tmp_path_factory.mktemp("pre-commit-home"))
    env.pop("PYTHONPATH", None)  # the hook must run from its own virtualenv, not this checkout
    return env


def engine_repo(path: Path, hook_source: tuple[Path, str], hook_ids: list[str], env) -> Path:
    """A git repository holding the scaffolded reference engine, with our hooks installed."""
    shutil.copytree(ENGINE, path, ignore=shutil.ignore_patterns("__pycache__"))
    proc = tool("scaffold", ".", cwd=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    source, sha = hook_source
    hooks = "".join(f"  - id: {hook_id}\n" for hook_id in hook_ids)
    (path / ".pre-commit-config.yaml").write_text(f"repos:\n- repo: {source}\n  rev: {sha}\n  hooks:\n{hooks}")
    git("init", "-q", cwd=path)
    subprocess.run([PRE_COMMIT, "install"], cwd=path, env=env, check=True, capture_output=True)
    return path


def test_commit_deleting_a_placeholder_is_refused_and_a_clean_one_passes(tmp_path, hook_source, pre_commit_env):
    repo = engine_repo(tmp_path / "engine", hook_source, ["canary-instrument-check"], pre_commit_env)
    git("add", "-A", cwd=repo)
    first = git("commit", "-m", "scaffolded engine", cwd=repo, env=pre_commit_env, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "canary-instrument check" in first.stdout + first.stderr  # the hook ran and passed

    # Delete the forward and install placeholders: the file as it was before scaffolding.
    shutil.copy2(ENGINE / MODEL_RUNNER, repo / MODEL_RUNNER)
    git("add", MODEL_RUNNER, cwd=repo)
    refused = git("commit", "-m", "drop the canary placeholders", cwd=repo, env=pre_commit_env, check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output
    assert "Failed" in output
    located = [m for m in FINDING.finditer(output) if m["path"].endswith(MODEL_RUNNER)]
    assert located, f"no path:line:col finding about {MODEL_RUNNER}:\n{output}"
    assert git("log", "--format=%s", cwd=repo).stdout.split("\n")[0] == "scaffolded engine"

    # Putting the placeholders back makes the same commit pass.
    git("checkout", "HEAD", "--", MODEL_RUNNER, cwd=repo)
    (repo / "NOTES.md").write_text("an unrelated change\n")
    git("add", "NOTES.md", cwd=repo)
    clean = git("commit", "-m", "unrelated change", cwd=repo, env=pre_commit_env, check=False)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    # The hook's cache sits at the repository root and ignores itself: nothing is left to stage.
    assert (repo / ".canary-instrument-cache" / ".gitignore").is_file()
    assert git("status", "--porcelain", "--untracked-files=all", cwd=repo).stdout == ""


def test_apply_hook_wires_the_tree_and_stops_the_commit_for_review(tmp_path, hook_source, pre_commit_env):
    repo = engine_repo(tmp_path / "engine", hook_source, ["canary-instrument-apply"], pre_commit_env)
    scaffolded = (repo / MODEL_RUNNER).read_bytes()
    git("add", "-A", cwd=repo)
    stopped = git("commit", "-m", "scaffolded engine", cwd=repo, env=pre_commit_env, check=False)
    assert stopped.returncode != 0, stopped.stdout + stopped.stderr
    assert "files were modified by this hook" in stopped.stdout + stopped.stderr
    wired = (repo / MODEL_RUNNER).read_bytes()
    assert wired != scaffolded and b"self.canary_ctx(" in wired

    git("add", "-A", cwd=repo)
    second = git("commit", "-m", "wired engine", cwd=repo, env=pre_commit_env, check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (repo / MODEL_RUNNER).read_bytes() == wired  # apply is idempotent: nothing left to do


def test_pre_commit_on_a_real_sglang_checkout(tmp_path, hook_source, pre_commit_env):
    """`pre-commit run --all-files` with the check hook on a released sglang package in a git repository:
    green after `scaffold` and `apply`; red with the finding that names it when a site's wiring is
    deleted, and when a new runner class adds a forward outside every site."""
    from tests.realtree.conftest import DEFAULT_RELEASE, sglang_srt

    repo = tmp_path / "sglang-checkout"
    shutil.copytree(sglang_srt(DEFAULT_RELEASE), repo / "sglang" / "srt")
    for command in ("scaffold", "apply"):
        proc = tool(command, "-q", ".", cwd=repo)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    source, sha = hook_source
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {source}\n  rev: {sha}\n  hooks:\n  - id: canary-instrument-check\n")
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)

    def run_all() -> tuple[int, list[tuple[str, str]]]:
        proc = subprocess.run([PRE_COMMIT, "run", "--all-files"], cwd=repo, env=pre_commit_env,
                              capture_output=True, text=True)
        found = [(m["path"], m["code"]) for m in FINDING.finditer(proc.stdout + proc.stderr)]
        return proc.returncode, found

    assert run_all() == (0, [])

    # A site's wiring deleted: the forward site of ModelRunner.forward (its line and its `with` item).
    model_runner = repo / "sglang/srt/model_executor/model_runner.py"
    wired = model_runner.read_text()
    unwired = re.sub(r"\n *canary_ctx = self\.canary_ctx\(forward_batch.*\)\n", "\n", wired, count=1)
    unwired = re.sub(r"\n *canary_ctx,\n", "\n", unwired, count=1)
    assert unwired.count("canary_ctx") == wired.count("canary_ctx") - 3  # the line names it twice
    model_runner.write_text(unwired)
    code, found = run_all()
    assert code == 1 and ("sglang/srt/model_executor/model_runner.py", "CI101") in found, found
    model_runner.write_text(wired)

    # A new runner class whose capture runs the model's forward outside every site.
    (repo / "sglang/srt/model_executor/runner/lookahead_graph_runner.py").write_text(
        "class LookaheadGraphRunner:\n"
        "    def __init__(self, model_runner):\n"
        "        self.model_runner = model_runner\n\n"
        "    def capture(self, forward_batch):\n"
        "        return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)\n"
    )
    code, found = run_all()
    assert (code, found) == (1, [("sglang/srt/model_executor/runner/lookahead_graph_runner.py", "CI301")])
