"""sglang 0.5.17's package as gpu.sh serves it, and a copy of it with one bug of ``bugs.py`` in it, for the CPU
replays of the corpus's bugs on the release's own classes (``evict_replay.py``, ``eagle_free_replay.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.bench.test_sglang_server import bundle, load

REPO = Path(__file__).resolve().parents[2]


def release_with_bug(tmp_path_factory, bug: str) -> tuple[Path, Path, Path]:
    """(the release's folder, the folder of its copy with ``bug``, the folder of the packages its memory-cache
    modules import: the real-class tests' cache); skips where the wheel or those packages cannot be fetched."""
    from tests.runtime.real_sglang import sglang_site

    pins, _ = bundle.read_lock(bundle.lock_file("0.5.17"))
    name = next(n for n in pins if n.startswith("sglang-0.5.17-"))
    cache = Path.home() / ".cache" / "canary-instrument" / "sglang-server-wheels"
    cache.mkdir(parents=True, exist_ok=True)
    try:
        wheel = bundle.fetch(name, pins[name], cache)
        folders = sglang_site.ensure_site()
    except (subprocess.CalledProcessError, sglang_site.IndexUnreachable) as unreachable:
        pytest.skip(f"sglang 0.5.17's wheel or the test packages cannot be fetched: {unreachable}")
    release = sglang_site.cache_root() / f"wheel-{pins[name][:12]}"
    if not (release / "sglang").is_dir():  # unpacked once, appearing whole or not at all
        partial = release.with_name(f"{release.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(partial, [n for n in zf.namelist() if n.startswith("sglang/")])
        try:
            os.replace(partial, release)
        except OSError:  # another process unpacked it first
            shutil.rmtree(partial, ignore_errors=True)
    bugs = load("bugs")
    buggy = tmp_path_factory.mktemp("bug") / "sglang"
    shutil.copytree(release / "sglang", buggy, copy_function=os.symlink)
    edited = buggy / "srt" / bugs.BUGS[bug].path
    text = edited.read_text()
    edited.unlink()  # a file of its own, not the link into the release
    edited.write_text(text)
    bugs.apply(buggy, bug)
    return release, buggy.parent, folders[1]


def replay(script: str, parent: Path, deps: Path) -> dict:
    """Run the replay ``tests/bench/<script>`` on the package under ``parent`` (in a process of its own: the two
    packages share module names) and return the JSON it prints last, whose ``sglang`` (the file of the module
    under test) must lie under ``parent``: the replay ran that package, not another sglang."""
    proc = subprocess.run([sys.executable, str(REPO / "tests/bench" / script), str(parent), str(deps)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sglang"].startswith(str(parent))
    return out
