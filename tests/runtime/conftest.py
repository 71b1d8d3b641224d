"""Runtime tests run on CPU with the torch reference backend, and again on a GPU when one is visible."""

import logging
import os

import pytest

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def dev(request):
    return request.param


@pytest.fixture
def canary_log(caplog):
    """Records the runtime's log lines (violations, stats, SWA divergence) at INFO and above."""
    caplog.set_level(logging.INFO, logger="canary_instrument.runtime")
    return caplog


@pytest.fixture(autouse=True)
def _clean_canary_env(monkeypatch):
    for var in (
        "KV_CANARY",
        "KV_CANARY_REAL_KV",
        "KV_CANARY_TOKEN_CHECK",
        "KV_CANARY_STATS_INTERVAL",
        "KV_CANARY_RING_SIZE",
        "KV_CANARY_SWA_DIVERGENCE_INTERVAL",
        "KV_CANARY_DIST_INTERVAL",
        "SGLANG_KV_CANARY_RING_CAPACITY",
        "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS",
        "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT",
        "SGLANG_KV_CANARY_SWA_DIVERGENCE_STATS_INTERVAL",
        "KV_CANARY_SWEEP_INTERVAL",
        "KV_CANARY_SWEEP_SLOTS",
        "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE",
        "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT",
        "SGLANG_KV_CANARY_TOKEN_ORACLE_SEED",
    ):
        monkeypatch.delenv(var, raising=False)
    for var in list(os.environ):
        if var.startswith(("SGLANG_KV_CANARY_PERTURB", "SGLANG_KV_CANARY_JITTER")):
            monkeypatch.delenv(var, raising=False)
