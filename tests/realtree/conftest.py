"""Released sglang trees for the real-tree tests: `sglang/srt` of a wheel, downloaded once into a cache.

The cache is `$CANARY_INSTRUMENT_SGLANG_CACHE` (default `~/.cache/canary-instrument/sglang`), shared
with tests/runtime/real_sglang: a release is read from `<cache>/<version>/sglang/srt` (a wheel's
`sglang/srt`, unpacked here), or from `<cache>/sglang-<version>/sglang/srt` (the runtime tests'
install of the same wheel). Otherwise `pip download --no-deps sglang==<version>` fetches the wheel
(`$CANARY_INSTRUMENT_SGLANG_WHEELS`, folders of wheels, makes that offline) and only `sglang/srt/`
is unpacked. A download failure is an error: CI reaches the index, and the default suite's release
(DEFAULT_RELEASE) must run there. The other releases carry the `realtree` marker and run only with
`-m realtree`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

DEFAULT_RELEASE = "0.5.20"
# Every release that carries upstream's canary wiring; 0.5.13 is the older layout
# (model_executor/cuda_graph_runner.py), 0.5.14, 0.5.17 and 0.5.20 the development releases.
RELEASES = ["0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
            "0.5.23"]
_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
         "--platform", "manylinux_2_34_x86_64", "--only-binary", ":all:"]


def cache_root() -> Path:
    return Path(os.environ.get("CANARY_INSTRUMENT_SGLANG_CACHE") or Path.home() / ".cache/canary-instrument/sglang")


def _download(version: str, cache: Path) -> Path:
    target = cache / version
    with tempfile.TemporaryDirectory() as tmp:
        wheels = [w for w in os.environ.get("CANARY_INSTRUMENT_SGLANG_WHEELS", "").split(os.pathsep) if w]
        source = [arg for folder in wheels for arg in ("--find-links", folder)]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", *_TAGS, "-d", tmp,
                   *(["--no-index", *source] if source else []), f"sglang=={version}"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        found = list(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(
                f"could not download sglang {version} ({' '.join(command)}):\n{proc.stdout}\n{proc.stderr}"
            )
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{version}-"))
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(staging, [m for m in wheel.namelist() if m.startswith("sglang/srt/")])
        try:
            staging.rename(target)  # atomic: a concurrent run either sees the whole tree or none
        except OSError:
            shutil.rmtree(staging)
    return target / "sglang" / "srt"


def sglang_wheel_file(version: str, member: str) -> Path:
    """One file of a release's wheel outside `sglang/srt` (`sglang/test/kv_canary/violation_log_utils.py`),
    downloaded on first use and kept in `<cache>/<version>.files/` (the release's own folder is the unpacked
    `srt` alone, made whole or not at all), or read from the runtime tests' install of the wheel."""
    cache = cache_root()
    for folder in (cache / f"{version}.files", cache / f"sglang-{version}"):
        if (folder / member).is_file():
            return folder / member
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", *_TAGS, "-d", tmp, f"sglang=={version}"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
        found = list(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"could not download sglang {version}:\n{proc.stdout}\n{proc.stderr}")
        target = cache / f"{version}.files" / member
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(found[0]) as wheel:
            staging = target.with_name(f".{target.name}.{os.getpid()}")
            staging.write_bytes(wheel.read(member))
            staging.replace(target)  # atomic: a concurrent run sees the whole file or none
    return target


def sglang_srt(version: str) -> Path:
    """The cached `sglang/srt` folder of a release (downloaded on first use)."""
    cache = cache_root()
    for folder in (cache / version, cache / f"sglang-{version}"):
        if (folder / "sglang" / "srt").is_dir():
            return folder / "sglang" / "srt"
    cache.mkdir(parents=True, exist_ok=True)
    return _download(version, cache)


def release_params():
    return [
        pytest.param(v, marks=() if v == DEFAULT_RELEASE else pytest.mark.realtree, id=v) for v in RELEASES
    ]


def pytest_collection_modifyitems(config, items):
    if "realtree" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason=f"real sglang trees other than {DEFAULT_RELEASE} run with `-m realtree`")
    for item in items:
        if item.get_closest_marker("realtree") is not None:
            item.add_marker(skip)
