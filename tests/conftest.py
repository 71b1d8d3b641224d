"""Shared test setup: kernels run through Triton's interpreter where there is no GPU."""

import os

import pytest
from hypothesis import HealthCheck, settings

# CI machines are shared and slow: example generation speed and per-example time are not behaviour.
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()
# Must be decided before triton is first imported; honour an explicit setting.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def device() -> str:
    """The device kernel tests run on: CUDA when present, else CPU through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
