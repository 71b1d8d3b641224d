"""Fixtures for the reference engine's own tests: the pristine `refsgl` package, one torch thread."""

import pytest
import torch

from canary_instrument.demo.engine_copy import import_engine, pristine_engine_dir


@pytest.fixture(autouse=True)
def one_torch_thread():
    # The engine's tensors are tiny; a 2-core CI box spends more time handing ops to threads than computing.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def refsgl():
    """The pristine engine's `refsgl.srt.entrypoints.engine` module (no canary wiring)."""
    return import_engine(pristine_engine_dir())
