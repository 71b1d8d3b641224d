"""Fixtures for the end-to-end suite: a reference-engine copy instrumented by the real CLI, imported once."""

import logging

import pytest
import torch

from canary_instrument.demo import engine_copy, matrix


@pytest.fixture
def slow_only(request):
    """The full matrix takes ~10 minutes on a 2-core CPU: run it only when `-m slow` selects it."""
    if "slow" not in (request.config.getoption("markexpr") or "") or "not slow" in request.config.getoption("markexpr"):
        pytest.skip("full fault matrix and 2,000-step clean runs: select them with -m slow")


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def instrumented(tmp_path_factory):
    """(root, report) of an engine copy after scaffold, check, apply, check."""
    root = tmp_path_factory.mktemp("instrumented") / "engine"
    engine_copy.copy_engine(root)
    return root, engine_copy.instrument(root)


@pytest.fixture
def engine_module(instrumented):
    # The demo's quieting is process-wide; give the runtime logger back its level so later tests see its warnings.
    runtime_log = logging.getLogger("canary_instrument.runtime")
    level = runtime_log.level
    matrix.quiet_canary_log()
    yield engine_copy.import_engine(instrumented[0])
    runtime_log.setLevel(level)


_BENCHES = {}


@pytest.fixture
def bench_for(engine_module):
    """One EngineBench per variant for the whole session (engines are reset between trials)."""

    def get(variant):
        key = (engine_module.__file__, variant)
        if key not in _BENCHES:
            _BENCHES[key] = matrix.EngineBench(engine_module, variant)
        return _BENCHES[key]

    return get
