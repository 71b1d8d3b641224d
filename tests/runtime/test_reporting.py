"""Violations reach the host from the words the post-forward passes publish (at the end of the step that
found them once the device has run it, on CPU always), each with the step of the forward that found it;
log mode logs parseable lines, raise mode raises once with all. Under a flood the log stays bounded: a few
full lines per step, the first of each new class always, summaries with the exact counts of the rest, an
optional JSON sink with every violation, and sglang's own line format for a team that keeps its tooling."""

import json

import pytest

from canary_instrument.runtime import CanaryViolationError, Violation, mark_init_finished
from canary_instrument.runtime.reports.stats import StatsLine
from canary_instrument.runtime.reports.summary import SummaryLine

from .mini_engine import MiniRunner, Scheduler, server_args


def _serving(dev, layout="mha", **args):
    runner = MiniRunner(server_args(**args), layout=layout, device=dev)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([11, 12, 13, 14]), sched.new_request([21, 22, 23, 24, 25])]
    runner.forward(sched.extend(reqs))
    return runner, sched, reqs


def _remap_and_step(runner, sched, reqs, token=(31, 32)):
    """Point request 0's position 2 at request 1's slot for position 2 (a remapped req_to_token entry)."""
    batch = sched.decode(reqs, list(token))
    runner.req_to_token_pool.req_to_token[reqs[0].row, 2] = reqs[1].slots[2]
    runner.forward(batch)


def test_violations_carry_the_step_that_found_them(dev, canary_log):
    runner, sched, reqs = _serving(dev)
    _remap_and_step(runner, sched, reqs)
    step = runner.canary_manager.step
    if dev == "cpu":  # the pass ran synchronously and published before the step ended
        assert {v.step for v in Violation.find_all(canary_log.text)} == {step}
    runner.forward(sched.decode(reqs, [41, 42]))
    runner.forward(sched.decode(reqs, [43, 44]))
    found = Violation.find_all(canary_log.text)
    assert found and {v.step for v in found} == {step}
    assert {v.req_pool_index for v in found} == {reqs[0].row}
    # Position 2 points at a row written for another request at the same position: its chain link is off.
    at_two = [v for v in found if v.position == 2 and v.kernel == "pre_forward"]
    assert at_two and all(v.reasons == {"link"} for v in at_two)
    assert {(v.group, v.half) for v in at_two} == {("full", "k"), ("full", "v")}


def test_a_readback_interval_spaces_the_snapshots_not_the_violations(dev, canary_log):
    """kv_canary_readback_interval=4: a tagged snapshot every 4th step; violations still come from the
    published words, with the step that found them."""
    runner, sched, reqs = _serving(dev, kv_canary_readback_interval=4)
    manager = runner.canary_manager
    copies = []
    take = manager._readback.take
    manager._readback.take = lambda tag: copies.append(tag.step) or take(tag)
    _remap_and_step(runner, sched, reqs)
    step = manager.step
    for i in range(6):
        runner.forward(sched.decode(reqs, [41 + i, 51 + i]))
    found = Violation.find_all(canary_log.text)
    assert found and {v.step for v in found} == {step} and step < 4
    assert {v.req_pool_index for v in found} == {reqs[0].row}
    assert copies == [4, 8]


def test_log_mode_lines_parse_back_and_serving_continues(dev, canary_log):
    runner, sched, reqs = _serving(dev)
    _remap_and_step(runner, sched, reqs)
    flushed = runner.canary_manager.flush()
    lines = [r.getMessage() for r in canary_log.records if "kv_canary violation:" in r.getMessage()]
    assert len(lines) == len(flushed) > 0
    assert [Violation.parse(line) for line in lines] == flushed
    for line in lines:
        for key in ("kernel=", "group=", "reason=", "slot=", "position=", "stored=", "expected="):
            assert key in line
    runner.forward(sched.decode(reqs, [1, 2]))  # log mode keeps serving


def test_raise_mode_raises_once_with_every_violation(dev):
    runner, sched, reqs = _serving(dev, kv_canary="raise")
    with pytest.raises(CanaryViolationError) as caught:
        _remap_and_step(runner, sched, reqs)  # raises here once the pass has published (on CPU, always)
        runner.forward(sched.decode(reqs, [41, 42]))
    err = caught.value
    assert len(err.violations) >= 4
    assert str(err).count("kv_canary violation:") == len(err.violations)
    assert [Violation.parse(line) for line in str(err).splitlines()[1:]] == err.violations


def test_flush_reads_the_last_step_immediately(dev):
    runner, sched, reqs = _serving(dev)
    _remap_and_step(runner, sched, reqs)
    violations = runner.canary_manager.flush()
    assert violations and all(v.step == runner.canary_manager.step for v in violations)
    assert runner.canary_manager.flush() == []  # each violation is returned once


def test_flush_in_raise_mode_raises(dev):
    runner, sched, reqs = _serving(dev, kv_canary="raise")
    with pytest.raises(CanaryViolationError):
        _remap_and_step(runner, sched, reqs)  # at the latest, flush() reads and raises what the step found
        runner.canary_manager.flush()


def test_flipped_real_kv_byte_is_a_fingerprint_violation(dev):
    runner, sched, reqs = _serving(dev, kv_canary_real_kv="partial")
    batch = sched.decode(reqs, [5, 6])
    # The layer this decode's pre-forward pass fingerprints for request 1 (realkv=partial's rotation), inside the
    # 16 fingerprinted bytes.
    layers = runner.token_to_kv_pool.k_buffer
    layer = int(runner.canary_manager.state.layer_cursor[reqs[1].row]) % len(layers)
    layers[layer][reqs[1].slots[1]].view(-1)[0] += 1.0
    runner.forward(batch)
    found = runner.canary_manager.flush()
    assert {(v.slot, v.position) for v in found} == {(reqs[1].slots[1], 1)}
    assert {v.reasons for v in found} == {frozenset({"fingerprint"})}
    assert {v.half for v in found} == {"k"}


def test_ring_overflow_is_reported_not_lost_silently(dev, canary_log):
    runner, sched, reqs = _serving(dev, kv_canary_ring_size=2)
    _remap_and_step(runner, sched, reqs)
    violations = runner.canary_manager.flush()
    assert len(violations) == 2
    assert "exceeded the ring (KV_CANARY_RING_SIZE=2)" in canary_log.text
    assert runner.canary_manager.stats().violations > 2


def test_periodic_stats_lines(dev, canary_log):
    runner, sched, reqs = _serving(dev, kv_canary_stats_interval=2)
    for i in range(4):
        runner.forward(sched.decode(reqs, [i, i]))
    runner.canary_manager.flush()
    # Steps 2 and 4 were read (one step late) at the ends of steps 3 and 5; flush read step 5.
    assert [line.step for line in StatsLine.find_all(canary_log.text)] == [2, 4]
    stats = runner.canary_manager.stats()
    # 4 + 5 prompt tokens, then 4 decode steps of 2 requests; each token has a K and a V row.
    assert stats.tokens_protected == 9 + 8
    assert stats.written == (9 + 8) * 2
    assert stats.pre_runs == stats.post_runs == 5 and stats.violations == 0


def _stats_lines(canary_log):
    return [f"steps={line.step}" for line in StatsLine.find_all(canary_log.text)]


def test_each_stats_line_is_logged_once_however_often_flush_runs(dev, canary_log):
    runner, sched, reqs = _serving(dev, kv_canary_stats_interval=2)  # step 1
    runner.forward(sched.decode(reqs, [1, 1]))  # step 2, a multiple of the interval
    runner.canary_manager.flush()
    runner.canary_manager.flush()  # no new step
    assert _stats_lines(canary_log) == ["steps=2"]
    runner.forward(sched.decode(reqs, [2, 2]))  # step 3: reads nothing new for the stats line
    runner.forward(sched.decode(reqs, [3, 3]))  # step 4
    runner.forward(sched.decode(reqs, [4, 4]))  # step 5 reads step 4
    runner.canary_manager.flush()
    assert _stats_lines(canary_log) == ["steps=2", "steps=4"]


@pytest.mark.parametrize("layout, rows_per_token", [("mha", 2), ("mla", 1), ("swa", 4)])
def test_tokens_protected_counts_tokens_on_every_layout(dev, canary_log, layout, rows_per_token):
    runner, sched, reqs = _serving(dev, layout=layout, kv_canary_stats_interval=3)  # 4 + 5 prompt tokens
    for i in range(2):
        runner.forward(sched.decode(reqs, [i, i]))
    assert runner.canary_manager.flush() == []
    stats = runner.canary_manager.stats()
    assert stats.tokens_protected == 9 + 2 * 2
    assert stats.written == rows_per_token * stats.tokens_protected
    assert f"tokens_protected={9 + 4} " in canary_log.text


def test_violation_line_round_trip():
    v = Violation(kernel="post_forward", group="swa", half="v", slot=7, position=3, stored=-5, expected=9,
                  reasons=frozenset({"token", "link"}), req_pool_index=2, step=11)
    line = "INFO prefix " + v.format()
    assert Violation.parse(line) == v
    assert "reason=link,token" in line
    assert Violation.parse("unrelated") is None
    with pytest.raises(ValueError, match="malformed"):
        Violation.parse("kv_canary violation: kernel=pre_forward slot=x")


def test_a_host_that_reads_more_than_64_passes_late_still_reports_every_violation(dev, canary_log):
    """Each pass publishes into slot pass % 64; a host that stopped reading for longer finds a later pass
    in the slot it expects, and that pass's count covers every record made since (step: that pass's)."""
    runner = MiniRunner(server_args(kv_canary_readback_interval=1000, kv_canary_log_lines_per_step=10_000),
                        device=dev, size=512, max_context=128)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request([11, 12, 13, 14]), sched.new_request([21, 22, 23, 24, 25])]
    runner.forward(sched.extend(reqs))
    manager = runner.canary_manager
    manager._poll_published = lambda: None  # the host stops reading the published words
    _remap_and_step(runner, sched, reqs)
    step = manager.step
    for i in range(66):  # every decode re-verifies the remapped position: records at every step
        runner.forward(sched.decode(reqs, [41 + i, 51 + i]))
    assert Violation.find_all(canary_log.text) == []
    del manager._poll_published  # reading again
    runner.forward(sched.decode(reqs, [7, 8]))
    found = Violation.find_all(canary_log.text)
    assert len(found) == manager.stats().violations == int(manager.state.ring_count[0])
    assert min(v.step for v in found) > step and {v.req_pool_index for v in found} == {reqs[0].row}


def _flood(dev, steps=6, **args):
    """A remapped req_to_token entry that every later decode re-reads: violations at every step."""
    runner, sched, reqs = _serving(dev, **args)
    _remap_and_step(runner, sched, reqs)
    for i in range(steps):
        runner.forward(sched.decode(reqs, [41 + i, 51 + i]))
    return runner, runner.canary_manager.flush()


def test_a_flood_logs_a_bounded_number_of_full_lines_and_summarises_the_rest_exactly(dev, canary_log):
    runner, every = _flood(dev, kv_canary_log_lines_per_step=1, kv_canary_summary_interval=3)
    logged = Violation.find_all(canary_log.text)
    summaries = SummaryLine.find_all(canary_log.text)
    by_step = {}
    for v in logged:
        by_step.setdefault(v.step, []).append(v)
    # The first violation of each (reasons, kernel, group) class is logged whatever the bound; beyond those,
    # one full line per step.
    classes = {(v.reasons, v.kernel, v.group) for v in every}
    assert {(v.reasons, v.kernel, v.group) for v in logged} == classes
    assert all(len(lines) <= 1 + len(classes) for lines in by_step.values())
    assert sum(len(lines) > 1 for lines in by_step.values()) <= len(classes)
    # Every violation is either logged in full or counted in a summary, by reason and kernel, exactly.
    assert summaries and sum(s.withheld for s in summaries) == len(every) - len(logged) > 0
    assert sum(s.logged for s in summaries) == len(logged)
    withheld = [v for v in every if v not in logged]
    link = sum("link" in v.reasons for v in withheld)
    assert sum(dict(s.reasons).get("link", 0) for s in summaries) == link
    assert {name for s in summaries for name, _ in s.kernels} <= {"pre_forward", "post_forward"}
    assert all(s.req_rows == 1 and s.first_step <= s.last_step for s in summaries)
    assert runner.canary_manager.stats().violations == len(every)  # the device's total, exact
    assert runner.canary_manager.stats_line().logged == len(logged)


def test_a_flood_that_lasts_logs_a_few_lines_an_interval_not_the_step_bound_at_every_step(dev, canary_log):
    runner, every = _flood(dev, steps=12, kv_canary_log_lines_per_step=2, kv_canary_log_lines_per_interval=3,
                           kv_canary_summary_interval=1000)
    logged = Violation.find_all(canary_log.text)
    classes = {(v.reasons, v.kernel, v.group) for v in every}
    # New classes still show in full; everything else of the interval went into its summary.
    assert {(v.reasons, v.kernel, v.group) for v in logged} == classes
    assert len(logged) <= max(3, len(classes)) < len(every)
    [summary] = SummaryLine.find_all(canary_log.text)
    assert summary.withheld + summary.logged == len(every) and summary.logged == len(logged)


def test_the_sink_holds_every_violation_as_json(dev, tmp_path):
    sink = tmp_path / "violations" / "run.jsonl"
    runner, every = _flood(dev, kv_canary_log_lines_per_step=0, kv_canary_violation_sink=str(sink))
    objects = [json.loads(line) for line in sink.read_text().splitlines()]
    assert objects == [v.as_dict() for v in every]
    assert objects[0].keys() == {"kernel", "group", "half", "reasons", "slot", "position", "stored", "expected",
                                 "req", "step"}


def test_the_sglang_line_format_is_what_sglang_s_own_test_helpers_parse(dev, canary_log):
    """The helper module of the wheel (sglang/test/kv_canary/violation_log_utils.py), run as shipped."""
    from tests.realtree.conftest import DEFAULT_RELEASE, sglang_wheel_file

    helpers: dict = {}
    try:
        source = sglang_wheel_file(DEFAULT_RELEASE, "sglang/test/kv_canary/violation_log_utils.py")
    except RuntimeError as err:  # no cached wheel and no package index (the lent GPU machines)
        pytest.skip(f"sglang {DEFAULT_RELEASE}'s wheel is not cached and cannot be downloaded: {err}".splitlines()[0])
    exec(compile(source.read_text(), str(source), "exec"), helpers)
    runner, every = _flood(dev, steps=1, kv_canary_log_format="sglang", kv_canary_log_lines_per_step=100)
    text = canary_log.text
    assert helpers["_VIOLATION_LINE_RE"].findall(text)
    assert helpers["find_violation_in_log"](text, launch_tag_patterns=("HEAD_K_FULL",), fail_reason="verify_chain_hash")
    assert not helpers["find_violation_in_log"](text, launch_tag_patterns=("SWEEP_*",), fail_reason="verify_chain_hash")
    with pytest.raises(AssertionError, match="Unexpected canary violation"):
        helpers["assert_no_violation_in_log"](text)
    assert Violation.find_all(text) == every  # and the runtime's own parser reads them back


def test_raise_mode_under_a_flood_raises_a_bounded_error_naming_the_first_violations(dev):
    runner, sched, reqs = _serving(dev, kv_canary="raise", kv_canary_log_lines_per_step=1)
    with pytest.raises(CanaryViolationError) as caught:
        _remap_and_step(runner, sched, reqs)
        runner.forward(sched.decode(reqs, [41, 42]))
    err = caught.value
    lines = str(err).splitlines()
    assert 1 <= len(err.violations) < 8
    assert lines[0] == f"{len(err.violations)} KV-canary violation(s):"
    assert [Violation.parse(line) for line in lines[1:1 + len(err.violations)]] == err.violations


def test_two_live_positions_sharing_one_swa_slot_are_caught(dev):
    """An SWA allocation that maps a decode's two new full slots to one SWA slot (bugs.py swa_mapping_shifted):
    both requests write their sliding-window row there, and the forward's own post-forward check reports the
    request whose row was overwritten, at its new position, in the SWA group (on a GPU the two writes race
    per half, so the K and V rows may each hold a different request's)."""
    runner = MiniRunner(server_args(), layout="swa", device=dev, window=4)
    sched = Scheduler(runner)
    mark_init_finished(runner.canary_manager)
    reqs = [sched.new_request(list(range(10, 16))), sched.new_request(list(range(20, 23)))]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [30, 40])
    mapping = runner.token_to_kv_pool.full_to_swa_index_mapping
    first, second = reqs[0].slots[-1], reqs[1].slots[-1]
    sched.free_swa.append(int(mapping[first]))  # the SWA slot the first position should have kept
    mapping[first] = mapping[second]
    runner.forward(batch)
    found = runner.canary_manager.flush()
    assert found and {(v.group, v.kernel) for v in found} == {("swa", "post_forward")}
    # Whichever write landed last holds a half's row: the other request reads it at the wrong position.
    assert {(v.req_pool_index, v.position, v.stored) for v in found} <= {(reqs[0].row, 6, 3), (reqs[1].row, 3, 6)}
    assert len({v.half for v in found}) == len(found)  # one report per overwritten half
    assert {v.step for v in found} == {runner.canary_manager.step}
