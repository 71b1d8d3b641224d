"""The HiCache shapes ``runtime/features/hicache.py`` relies on, read from every released sglang's source: the MHA
and MLA host pools define a backup and a per-layer load taking the device pool, host indices and device indices, and
the method the runtime wraps (the first of its ranked names a release defines) is the one the release's
transfer path calls. Source only (ast): the host pools of most releases need CUDA kernels to move bytes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from canary_instrument.runtime.features.hicache import _TRANSFER_PARAMS, BACKUP_NAMES, LOAD_NAMES

from .conftest import release_params, sglang_srt

HOST_CLASSES = ("HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost")


def _host_sources(srt: Path) -> list[Path]:
    files = [srt / "mem_cache" / "memory_pool_host.py", *sorted((srt / "mem_cache" / "pool_host").glob("*.py"))]
    return [f for f in files if f.is_file()]


def _methods(srt: Path) -> dict:
    """(class, method) -> positional parameter names, for the host classes."""
    found = {}
    for path in _host_sources(srt):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in HOST_CLASSES:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        found[(node.name, item.name)] = [a.arg for a in item.args.args[1:]]
    return found


def _called(srt: Path, name: str) -> bool:
    calls = srt / "managers" / "cache_controller.py", srt / "mem_cache" / "l2_transfer.py"
    return any(f".{name}(" in path.read_text() for path in calls if path.is_file())


@pytest.mark.parametrize("version", release_params())
def test_host_pools_move_kv_with_host_and_device_indices_through_the_method_the_runtime_wraps(version):
    srt = sglang_srt(version)
    methods = _methods(srt)
    assert {cls for cls, _ in methods} >= set(HOST_CLASSES), f"{version}: host pool classes moved"
    for names, per_layer in ((BACKUP_NAMES, False), (LOAD_NAMES, True)):
        defined = [n for n in names if any(m == n for _, m in methods)]
        assert defined, f"{version}: none of {names} is defined"
        wrapped = defined[0]
        assert _called(srt, wrapped), f"{version}: {wrapped} is defined but the transfer path does not call it"
        needed = set(_TRANSFER_PARAMS) | ({"layer_id"} if per_layer else set())
        for cls in ("MHATokenToKVPoolHost", "MLATokenToKVPoolHost"):
            own = methods.get((cls, names[-1])) or methods[("HostKVCache", names[-1])]
            assert needed <= set(own), f"{version}: {cls}.{names[-1]} takes {own}"
