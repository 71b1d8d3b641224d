"""CI301 and the cache on released sglang trees: the triaged findings (docs/ci301-triage.md), nothing else.

The trees come from `$CANARY_INSTRUMENT_SGLANG_CACHE/<version>/sglang` (default
`~/.cache/canary-instrument/sglang`) or the development machine's `/work/sglang_cache`, else from
`pip download --no-deps sglang==<version>` into that cache; without either the tests skip and say why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.io.cache import CheckCache
from canary_instrument.rewrite.check import check_tree

# Every CI301 finding per development release: (path under srt/, line), all triaged right.
TRIAGED = {
    "0.5.14": {
        ("model_executor/cpu_graph_runner.py", 829),
        ("model_executor/runner/prefill_cuda_graph_runner.py", 413),
        ("speculative/dflash_worker_v2.py", 1485),
        ("speculative/frozen_kv_mtp_worker_v2.py", 451),
        ("speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py", 434),
    },
    "0.5.17": {
        ("model_executor/cpu_graph_runner.py", 830),
        ("model_executor/runner/prefill_cuda_graph_runner.py", 676),
        ("speculative/frozen_kv_mtp_worker_v2.py", 471),
        ("speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py", 407),
    },
    "0.5.20": {
        ("model_executor/cpu_graph_runner.py", 844),
        ("model_executor/runner/prefill_cuda_graph_runner.py", 755),
        ("speculative/frozen_kv_mtp_worker_v2.py", 488),
        ("speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py", 411),
    },
}


def sglang_srt(version: str) -> Path:
    cache = Path(os.environ.get("CANARY_INSTRUMENT_SGLANG_CACHE", Path.home() / ".cache/canary-instrument/sglang"))
    for base in (cache, Path("/work/sglang_cache")):
        if (base / version / "sglang" / "srt").is_dir():
            return base / version / "sglang" / "srt"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", tmp,
                 f"sglang=={version}"], capture_output=True, text=True, timeout=300,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"sglang {version} is not cached and downloading it timed out")
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not wheels:
            pytest.skip(f"sglang {version} is not cached under {cache} and pip could not download it (offline?)")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(cache / version, [m for m in wheel.namelist() if m.startswith("sglang/")])
    return cache / version / "sglang" / "srt"


@pytest.mark.parametrize("version", sorted(TRIAGED))
def test_ci301_reports_exactly_the_triaged_paths_and_the_cache_changes_nothing(version, tmp_path, monkeypatch):
    srt = sglang_srt(version)
    catalog = load_catalog(srt)
    cold = check_tree([srt], catalog)
    assert cold.errors == []
    found = {(f.path.relative_to(srt).as_posix(), f.line) for f in cold.findings if f.code == "CI301"}
    assert found == TRIAGED[version]
    assert not any("internvl_vit" in path or "eager_runner" in path for path, _ in found)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for _ in range(2):  # the run that fills the cache, then a warm one
        cached = check_tree([srt], catalog, cache=CheckCache.open([srt], catalog, tmp_path / "cache"))
        assert [str(f) for f in cached.findings] == [str(f) for f in cold.findings]
