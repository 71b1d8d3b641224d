"""Bad input and write safety through the real CLI (`python -m canary_instrument`).

Each unprocessable file gets one `path:line:col` error and exit 2, is never written, and the
rest of the tree is still processed; CRLF, BOM and tabs survive scaffold/apply/revert; an apply
killed at any moment leaves every file whole.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "golden" / "engine"
SITE_FILES = (
    "refsgl/srt/model_executor/model_runner.py",
    "refsgl/srt/model_executor/cuda_graph_runner.py",
    "refsgl/srt/speculative/eagle_worker_v2.py",
    "refsgl/srt/speculative/eagle_draft_extend_cuda_graph_runner.py",
)
# Files that only `apply` changes: it places a hook there, `scaffold` has nothing to do.
HOOK_FILES = ("refsgl/srt/managers/scheduler.py",)
WIRED_FILES = SITE_FILES + HOOK_FILES
VICTIM = "refsgl/srt/model_executor/cuda_graph_runner.py"
FINDING = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>\S+) (?P<message>.*)$")


# --- helpers ---------------------------------------------------------------------------------


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def unprivileged_prefix() -> list[str]:
    """Root ignores file permissions unless it drops the two DAC-override capabilities."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: an unreadable file cannot be made")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--"]


def run_cli(*args: str, prefix: list[str] = (), env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "canary_instrument", *args],
        capture_output=True, text=True, env=env or cli_env(), timeout=300,
    )


def findings(proc: subprocess.CompletedProcess) -> list[dict]:
    """Every `path:line:col: CODE message` line the CLI printed, on either stream."""
    found = []
    for line in (proc.stdout + proc.stderr).splitlines():
        match = FINDING.match(line)
        if match:
            item = match.groupdict()
            item["path"] = os.path.normpath(os.path.abspath(item["path"]))
            item["line"], item["col"] = int(item["line"]), int(item["col"])
            found.append(item)
    return found


def snapshot(root: Path) -> dict[str, tuple]:
    """Bytes (or link target) and mtime of every entry, without following links."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                content = ("link", os.readlink(path))
            else:
                try:
                    content = Path(path).read_bytes()
                except PermissionError:
                    content = ("unreadable", st.st_size)
            state[os.path.relpath(path, root)] = (content, st.st_mtime_ns, st.st_mode)
    return state


def copy_engine(dest: Path) -> Path:
    shutil.copytree(ENGINE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def read_tree(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in WIRED_FILES}


@pytest.fixture(scope="module")
def states(tmp_path_factory) -> dict[str, Path]:
    """The engine pristine, scaffolded and applied, each produced once by the CLI."""
    base = tmp_path_factory.mktemp("states")
    pristine = copy_engine(base / "pristine")
    scaffolded = copy_engine(base / "scaffolded")
    proc = run_cli("scaffold", str(scaffolded))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    applied = base / "applied"
    shutil.copytree(scaffolded, applied)
    proc = run_cli("apply", str(applied))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rel in SITE_FILES:
        assert (scaffolded / rel).read_bytes() != (pristine / rel).read_bytes(), f"scaffold left {rel} alone"
    for rel in HOOK_FILES:
        assert (scaffolded / rel).read_bytes() == (pristine / rel).read_bytes(), f"scaffold changed {rel}"
    for rel in WIRED_FILES:
        assert (applied / rel).read_bytes() != (scaffolded / rel).read_bytes(), f"apply left {rel} alone"
    return {"pristine": pristine, "scaffolded": scaffolded, "applied": applied}


# --- one bad file among good ones ------------------------------------------------------------


def line_of(data: bytes, needle: bytes) -> int:
    return data[: data.index(needle)].count(b"\n") + 1


def syntax_error(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / VICTIM
    data = path.read_bytes()
    path.write_bytes(data + b"\ndef broken(:\n    pass\n")
    return path, data.count(b"\n") + 2, None


def undecodable(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / VICTIM
    first, rest = path.read_bytes().split(b"\n", 1)
    path.write_bytes(first + b"\n# caf\xe9 au lait\n" + rest)  # latin-1 byte in a UTF-8 file
    return path, 2, 6


def not_round_trippable(tree: Path) -> tuple[Path, int | None, int | None]:
    # A form feed at the start of a line is valid Python (it resets the indentation count),
    # but libcst 1.x drops it when it regenerates the module: the output would lose a byte.
    path = tree / VICTIM
    data = path.read_bytes()
    needle = b"\nclass CudaGraphRunner"
    path.write_bytes(data.replace(needle, b"\n\x0cclass CudaGraphRunner", 1))
    return path, line_of(data, needle) + 1, 1


def trailing_cr(tree: Path) -> tuple[Path, int | None, int | None]:
    # A last line ended by a lone CR (old Mac line end) is valid Python; libcst 1.x drops that CR.
    path = tree / VICTIM
    data = path.read_bytes()
    assert data.endswith(b"\n") and not data.endswith(b"\r\n")
    path.write_bytes(data[:-1] + b"\r")
    return path, data.count(b"\n"), None


def except_space(tree: Path) -> tuple[Path, int | None, int | None]:
    # `except OSError :` (a space before the colon, no `as`): libcst 1.x drops the space.
    path = tree / VICTIM
    data = path.read_bytes()
    path.write_bytes(data + b"\n\ndef _probe():\n    try:\n        pass\n    except OSError :\n        pass\n")
    return path, data.count(b"\n") + 6, None


def binary(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / VICTIM
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    return path, 1, 8


def unreadable(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / VICTIM
    path.chmod(0)
    return path, 1, 1


def symlink_loop(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / VICTIM
    path.unlink()
    path.symlink_to(path.name)
    return path, 1, 1


def directory_loop(tree: Path) -> tuple[Path, int | None, int | None]:
    path = tree / "refsgl/srt/mem_cache/again"
    path.symlink_to("..", target_is_directory=True)
    return path, 1, 1


BAD = {
    "syntax_error": syntax_error,
    "undecodable": undecodable,
    "not_round_trippable": not_round_trippable,
    "trailing_cr": trailing_cr,
    "except_space": except_space,
    "binary": binary,
    "unreadable": unreadable,
    "symlink_loop": symlink_loop,
    "directory_loop": directory_loop,
}
STARTS = {"scaffold": "pristine", "apply": "scaffolded", "revert": "applied", "check": "scaffolded"}


# Files libcst cannot reproduce byte for byte. The rewriting commands compare libcst's output
# with the input and refuse any such file; check never imports libcst (pre-commit speed), so it
# cannot know every such construct and is tested on its own below.
ROUND_TRIP = ("not_round_trippable", "trailing_cr", "except_space")
CASES = [(command, kind) for kind in BAD for command in STARTS if not (command == "check" and kind in ROUND_TRIP)]


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_bad_file_is_reported_once_left_alone_and_the_rest_is_processed(states, tmp_path, command, kind):
    tree = tmp_path / "tree"
    shutil.copytree(states[STARTS[command]], tree, symlinks=True)
    bad_path, line, col = BAD[kind](tree)
    prefix = unprivileged_prefix() if kind == "unreadable" else []
    before = snapshot(tree)
    try:
        proc = run_cli(command, str(tree), prefix=prefix)
        after = snapshot(tree)
    finally:
        if kind == "unreadable":
            bad_path.chmod(0o644)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output

    about_bad = [f for f in findings(proc) if f["path"] == os.path.normpath(bad_path)]
    assert len(about_bad) == 1, f"expected one error naming {bad_path}:\n{output}"
    if line is not None:
        assert about_bad[0]["line"] == line, output
    if col is not None:
        assert about_bad[0]["col"] == col, output

    rel_bad = os.path.relpath(bad_path, tree)
    assert after.get(rel_bad) == before[rel_bad], "the bad file was touched"
    assert set(after) == set(before), "files appeared or vanished"

    # Every other wired file went on to its next state (check writes nothing at all).
    nxt = {"scaffold": "scaffolded", "apply": "applied", "revert": "scaffolded", "check": "scaffolded"}[command]
    for rel in WIRED_FILES:
        if tree / rel == bad_path:
            continue
        assert (tree / rel).read_bytes() == (states[nxt] / rel).read_bytes(), f"{rel} was not processed"
    for rel, (content, mtime, mode) in before.items():
        if rel not in WIRED_FILES:
            assert after[rel] == (content, mtime, mode), f"{rel} is not a wired file but changed"


@pytest.mark.parametrize("kind", ROUND_TRIP)
def test_check_on_a_file_libcst_cannot_reproduce(states, tmp_path, kind):
    """check either reports the file (one located error, exit 2) or analyses it as usual (exit 0)."""
    tree = tmp_path / "tree"
    shutil.copytree(states["scaffolded"], tree)
    bad_path, line, _ = BAD[kind](tree)
    before = snapshot(tree)
    proc = run_cli("check", str(tree))
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 2), output
    if proc.returncode == 2:
        assert [(f["path"], f["line"]) for f in findings(proc)] == [(os.path.normpath(bad_path), line)], output
    else:
        assert findings(proc) == [], output
    assert snapshot(tree) == before


# --- formatting survives every command -------------------------------------------------------


def windows_tabs_bom(data: bytes) -> bytes:
    """The same module with a BOM, CRLF line ends and one tab per leading four spaces."""
    lines = []
    for line in data.split(b"\n"):
        stripped = line.lstrip(b" ")
        width = len(line) - len(stripped)
        lines.append(b"\t" * (width // 4) + b" " * (width % 4) + stripped)
    return b"\xef\xbb\xbf" + b"\r\n".join(lines)


def test_crlf_bom_and_tabs_survive_scaffold_apply_and_revert(states, tmp_path):
    tree = copy_engine(tmp_path / "tree")
    for rel in WIRED_FILES:
        (tree / rel).write_bytes(windows_tabs_bom((tree / rel).read_bytes()))
    others = {rel: v for rel, v in snapshot(tree).items() if rel not in WIRED_FILES}

    for command, state in (("scaffold", "scaffolded"), ("apply", "applied"), ("revert", "scaffolded")):
        proc = run_cli(command, str(tree))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for rel in WIRED_FILES:
            got = (tree / rel).read_bytes()
            assert got.startswith(b"\xef\xbb\xbf"), f"{command} dropped the BOM of {rel}"
            assert b"\n" not in got.replace(b"\r\n", b""), f"{command} wrote a bare LF into {rel}"
            assert got == windows_tabs_bom((states[state] / rel).read_bytes()), (
                f"{command} on a CRLF/BOM/tab copy of {rel} differs from the same transform of "
                "its plain output"
            )
        assert {rel: v for rel, v in snapshot(tree).items() if rel not in WIRED_FILES} == others


def test_unchanged_files_are_never_rewritten(states, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(states["applied"], tree)
    before = snapshot(tree)
    proc = run_cli("apply", str(tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(tree) == before  # bytes, mtimes and modes, site files included


def test_mode_is_kept_when_a_site_file_is_rewritten(states, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(states["scaffolded"], tree)
    (tree / VICTIM).chmod(0o750)
    proc = run_cli("apply", str(tree))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tree / VICTIM).read_bytes() == (states["applied"] / VICTIM).read_bytes()
    assert (tree / VICTIM).stat().st_mode & 0o7777 == 0o750


# --- an apply killed at any moment -----------------------------------------------------------

# Loaded by the child interpreter at start-up: every fsync announces itself on stderr and then
# takes a while, so the parent can kill the child at a known point inside an atomic write.
SLOW_FSYNC = """
import os, sys, time
_fsync = os.fsync
def fsync(fd):
    os.write(2, b"@@fsync\\n")
    time.sleep(float(os.environ["CANARY_TEST_FSYNC_DELAY"]))
    _fsync(fd)
os.fsync = fsync
"""


def start_slow_apply(tree: Path, hooks: Path, delay: float) -> subprocess.Popen:
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hooks), env["PYTHONPATH"]])
    env["CANARY_TEST_FSYNC_DELAY"] = str(delay)
    return subprocess.Popen(
        [sys.executable, "-m", "canary_instrument", "apply", str(tree)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )


def assert_whole(tree: Path, scaffolded: Path, applied: Path) -> int:
    """Every wired file is either its old or its new bytes; returns how many are new."""
    new = 0
    for rel in WIRED_FILES:
        got = (tree / rel).read_bytes()
        old, wired = (scaffolded / rel).read_bytes(), (applied / rel).read_bytes()
        assert got in (old, wired), f"{rel} is neither the old nor the new file after a kill"
        new += got == wired
    known = set(snapshot(scaffolded))
    stray = sorted(p for p in tree.rglob("*.py") if p.relative_to(tree).as_posix() not in known)
    assert stray == [], f"temp files visible as Python files: {stray}"
    return new


def test_apply_killed_at_every_write_leaves_every_file_whole(states, tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_FSYNC)
    marks_seen = []
    kill_at = 1
    while True:
        tree = tmp_path / f"tree{kill_at}"
        shutil.copytree(states["scaffolded"], tree)
        proc = start_slow_apply(tree, hooks, delay=0.2)
        marks = 0
        finished = False
        while marks < kill_at:
            line = proc.stderr.readline()
            if not line:
                finished = True
                break
            marks += line.strip() == b"@@fsync"
        if not finished:
            time.sleep(0.05)  # inside the slowed fsync: the temp file is written, not yet renamed
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        new = assert_whole(tree, states["scaffolded"], states["applied"])
        marks_seen.append((kill_at, new, finished))
        # Running apply again completes the job from wherever the kill left it.
        done = run_cli("apply", str(tree))
        assert done.returncode == 0, done.stdout + done.stderr
        assert read_tree(tree) == read_tree(states["applied"])
        if finished:
            break
        kill_at += 1
    # The writes went through fsync, and kills landed between the first and the last of them.
    assert len(marks_seen) > 2, f"apply performed no fsynced write: {marks_seen}"
    assert any(0 < new < len(WIRED_FILES) for _, new, _ in marks_seen), marks_seen


def test_apply_killed_at_random_moments_leaves_every_file_whole(states, tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_FSYNC)
    tree = tmp_path / "timing"
    shutil.copytree(states["scaffolded"], tree)
    start = time.perf_counter()
    proc = start_slow_apply(tree, hooks, delay=0.05)
    proc.communicate(timeout=120)
    full = time.perf_counter() - start
    assert proc.returncode == 0

    rng = random.Random(20261121)
    for trial in range(12):
        tree = tmp_path / f"tree{trial}"
        shutil.copytree(states["scaffolded"], tree)
        proc = start_slow_apply(tree, hooks, delay=0.05)
        time.sleep(rng.uniform(0.0, full))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert_whole(tree, states["scaffolded"], states["applied"])
