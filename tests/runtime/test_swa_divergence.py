"""The SWA divergence reporter: one parseable line every ``interval`` steps, off by default."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary_instrument.runtime import SwaDivergenceLog, mark_init_finished

from .mini_engine import MiniRunner, Scheduler, server_args

counts = st.integers(min_value=0, max_value=2**62)


@given(counts, counts, counts, counts, counts)
def test_format_parse_round_trip(a, b, c, d, e):
    record = SwaDivergenceLog(a, b, c, d, e)
    line = record.format()
    assert line.startswith("kv_canary_swa_divergence=")
    assert SwaDivergenceLog.parse("2026-01-01 INFO " + line + "  ") == record
    json.loads(line.split("=", 1)[1])  # the payload is plain JSON


def test_find_last_and_malformed_lines():
    first, last = SwaDivergenceLog(1, 2, 3, 4, 5), SwaDivergenceLog(6, 7, 8, 9, 10)
    text = "\n".join(["start", first.format(), "noise", last.format(), "tail"])
    assert SwaDivergenceLog.find_last(text) == last
    assert SwaDivergenceLog.find_last("nothing here") is None
    assert SwaDivergenceLog.parse("no record") is None
    with pytest.raises(ValueError, match="malformed"):
        SwaDivergenceLog.parse('kv_canary_swa_divergence={"forward_ct": 1}')


def _swa_run(dev, steps):
    runner = MiniRunner(server_args(), layout="swa", device=dev, window=4)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request(list(range(10, 16))), sched.new_request(list(range(20, 23)))]
    runner.forward(sched.extend(reqs))
    expected = {}
    for i in range(steps):
        batch = sched.decode(reqs, [30 + i, 40 + i])
        mapping = runner.token_to_kv_pool.full_to_swa_index_mapping
        idx = range(1, mapping.shape[0])
        remapped = sum(1 for s in idx if int(mapping[s]) not in (0, s))
        out_of_window = sum(max(0, int(n) - 4) for n in batch.seq_lens.tolist())
        runner.forward(batch)
        expected[runner.canary_manager.step] = (remapped, out_of_window)
    runner.canary_manager.flush()
    return runner, expected


def test_reporter_emits_every_interval_steps(dev, canary_log, monkeypatch):
    monkeypatch.setenv("KV_CANARY_SWA_DIVERGENCE_INTERVAL", "3")
    runner, expected = _swa_run(dev, steps=6)
    lines = [SwaDivergenceLog.parse(r.getMessage()) for r in canary_log.records]
    records = [r for r in lines if r is not None]
    assert [r.forward_ct for r in records] == [3, 6]
    for record in records:
        assert (record.swa_full_idx_divergence, record.swa_out_of_window_tokens) == expected[record.forward_ct]
        # The SWA group verifies only the window, so it sees fewer entries than the FULL group.
        assert 0 < record.verify_swa < record.verify_full
    assert records[-1].swa_out_of_window_tokens > 0 and records[-1].swa_full_idx_divergence > 0
    assert SwaDivergenceLog.find_last(canary_log.text) == records[-1]
    assert runner.canary_manager.flush() == []


def test_reporter_is_off_by_default(dev, canary_log):
    _swa_run(dev, steps=4)
    assert SwaDivergenceLog.find_last(canary_log.text) is None
