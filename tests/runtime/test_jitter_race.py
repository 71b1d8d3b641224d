"""Jitter turns a latent stream race into a canary violation (GPU).

The scenario (a KV write on a side stream that the forward never waits for) is
``canary_instrument/demo/jitter_race.py``, which ``canary-instrument demo`` runs too; here on the pristine
engine wired by the test harness. Without jitter the race stays hidden, with jitter at the KV write the
canary reports ``fingerprint`` violations, and with the wait in place the same jitter reports nothing.
"""

import pytest

from canary_instrument.demo import jitter_race
from canary_instrument.runtime.features.jitter import JitteredOps

from .refsgl_harness import instrumented

pytestmark = pytest.mark.gpu


def _harness_engine(args):
    h = instrumented(**args)
    return h.engine, h.manager


def _run(monkeypatch, jitter_us: int, join: bool):
    for name, value in jitter_race.jitter_environ(jitter_us).items():
        monkeypatch.setenv(name, value)
    return jitter_race.run_race(_harness_engine, jitter_us, join)


def test_the_race_is_latent_without_jitter(monkeypatch):
    run = _run(monkeypatch, jitter_us=0, join=False)
    assert run.manager.jitter is None
    assert run.violations == []
    assert run.manager.stats().post_runs >= jitter_race.STEPS  # the canary ran on every forward and saw nothing


def test_jitter_makes_the_canary_report_the_race(monkeypatch):
    run = _run(monkeypatch, jitter_us=jitter_race.JITTER_US, join=False)
    assert not isinstance(run.manager.ops, JitteredOps) and run.manager.jitter.counts()["attn_before"] > 0
    assert run.violations, "jitter at the KV write should have exposed the missing stream wait"
    assert "fingerprint" in run.reasons, [v.format() for v in run.violations[:5]]


def test_with_the_wait_in_place_jitter_reports_nothing(monkeypatch):
    run = _run(monkeypatch, jitter_us=jitter_race.JITTER_US, join=True)
    assert run.manager.jitter.totals_us()["attn_before"] > 0
    assert run.violations == []
