"""The real-class tests import sglang 0.5.20's own pools, allocators, ForwardBatch and ServerArgs.

sglang is installed on first use into a cache outside the repository (``sglang_site.py``) and is on
``sys.path`` only while these tests run. The tests skip, with a sentence saying so, only when the
package index cannot be reached; any other install failure is an error.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from . import sglang_site

_MODULES = {
    "memory_pool": "sglang.srt.mem_cache.memory_pool",
    "swa_memory_pool": "sglang.srt.mem_cache.swa_memory_pool",
    "token_allocator": "sglang.srt.mem_cache.allocator.token",
    "swa_allocator": "sglang.srt.mem_cache.allocator.swa",
    "forward_batch_info": "sglang.srt.model_executor.forward_batch_info",
    "radix_attention": "sglang.srt.layers.radix_attention",
    "server_args": "sglang.srt.server_args",
}


@pytest.fixture(scope="session")
def sg():
    """sglang's real modules, by short name (``sg.memory_pool.MHATokenToKVPool``, ...)."""
    try:
        folders = sglang_site.ensure_site()
    except sglang_site.IndexUnreachable as unreachable:
        pytest.skip(str(unreachable))
    with sglang_site.on_path(folders):
        modules = {name: importlib.import_module(path) for name, path in _MODULES.items()}
        import sglang

        modules["version"] = sglang.__version__
        # A server publishes its parallel layout at start-up; the MLA pool's write path reads one
        # field of it. sglang's own test primitive states it for a single process (no decode
        # context parallelism).
        parallel = importlib.import_module("sglang.srt.runtime_context").get_parallel()
        with parallel.override(dcp_enabled=False):
            yield SimpleNamespace(**modules)
