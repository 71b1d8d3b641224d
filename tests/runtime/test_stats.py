"""The kv_canary_stats= line and the enable warning."""

import pytest

from .refsgl_harness import instrumented

from canary_instrument.runtime.passes.state import LINK, PADDING_SLOT, TOKEN
from canary_instrument.runtime.reports.reporting import ReasonCounts
from canary_instrument.runtime.reports.stats import EnableWarner, StatsLine


def test_stats_line_round_trip_and_find_all():
    line = StatsLine(step=200, tokens_protected=2560, verified=81234, written=5120, pre_runs=200, post_runs=200,
                     violations=3, reasons=(("position", 1), ("fingerprint", 2)), swept=40960, sweep_passes=3,
                     sweep_pass_rows=1024, logged=2)
    text = line.format()
    assert text == ("kv_canary_stats= step=200 tokens_protected=2560 verified=81234 written=5120 pre_runs=200 "
                    "post_runs=200 violations=3 reasons=position:1,fingerprint:2 swept=40960 sweep_passes=3 "
                    "sweep_pass_rows=1024 logged=2")
    assert StatsLine.parse(text.removesuffix(" logged=2")).logged == 0  # a line from before the field
    quiet = StatsLine(step=1, verified=0, written=0, violations=0)
    assert "reasons=-" in quiet.format()
    log = f"INFO canary_instrument.runtime: {text}\nkv_canary violation: no\nINFO x: {quiet.format()}\n"
    assert StatsLine.find_all(log) == [line, quiet]
    assert line.reason_count("fingerprint") == 2 and line.reason_count("token") == 0
    assert StatsLine.parse("kv_canary stats: steps=2") is None
    with pytest.raises(ValueError, match="malformed kv_canary_stats= line"):
        StatsLine.parse("kv_canary_stats= step=1 verified=x")


def test_reason_counts_count_each_reason_of_each_record_in_bit_order():
    counter = ReasonCounts()
    counter.bits.update([TOKEN | LINK, LINK, PADDING_SLOT])
    assert counter.as_tuple() == (("link", 2), ("token", 1), ("padding_slot", 1))


def test_enable_warner_warns_once_when_init_never_finished(canary_log):
    warner = EnableWarner(after_forwards=4)
    assert warner.observe(forwards=3, init_finished=False) is None
    message = warner.observe(forwards=4, init_finished=False)
    assert "mark_init_finished() was not called after 4 forwards" in message
    assert warner.observe(forwards=5, init_finished=False) is None
    assert [r.getMessage() for r in canary_log.records if r.levelname == "WARNING"] == [message]


def test_enable_warner_warns_when_steps_ran_no_kernel():
    warner = EnableWarner(after_forwards=4)
    assert warner.observe(forwards=9, init_finished=True, steps=3) is None  # too early to tell
    assert warner.observe(forwards=9, init_finished=True, steps=6, planned=5, pre_runs=5, post_runs=5) is None
    assert warner.done  # the counters are cumulative: once kernels ran, "none ran" can never hold again
    warner = EnableWarner(after_forwards=4)
    message = warner.observe(forwards=10, init_finished=True, steps=6, planned=0)
    assert "no canary kernel ran in 6 steps since init (0 sub-forwards planned)" in message
    healthy = EnableWarner(after_forwards=4)
    for n in range(4, 40):
        assert healthy.observe(forwards=n, init_finished=True, steps=n, planned=n, pre_runs=n - 1, post_runs=n - 1) is None
    with pytest.raises(ValueError, match="after_forwards >= 1"):
        EnableWarner(after_forwards=0)


@pytest.mark.parametrize("wired", [True, False])
def test_the_manager_warns_when_init_never_finished(wired, canary_log):
    # The manager counts the forwards it sees; a forgotten init-finished hook is named once, after 32 of them.
    harness = instrumented("mha", init_finished=wired)
    harness.engine.generate([[1, 2, 3, 4, 5], [1, 2, 9]], max_new_tokens=40)
    harness.manager.flush()
    warnings = [r.getMessage() for r in canary_log.records if r.levelname == "WARNING"]
    if wired:
        assert warnings == [] and harness.manager.stats().pre_runs > 0
    else:
        assert warnings == [
            "kv canary is enabled but mark_init_finished() was not called after 32 forwards: canary passes stay "
            "disabled until it is (is the init-finished hook wired? run `canary-instrument check`)"
        ]
