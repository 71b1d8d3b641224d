"""The one-copy staging path: the expected-token table and the plans come out as the documented rules say,
whichever way the cells were packed (regular decode grid, general, or too many for the staging region)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from canary_instrument.runtime import mark_init_finished
from canary_instrument.runtime.expected_tokens import ExpectedTokenTable
from canary_instrument.runtime.plan import index_runs
from canary_instrument.runtime.staging import Staging

from .mini_engine import ForwardMode, MiniRunner, RecordingOps, Scheduler, server_args

MAX_REQS, MAX_CONTEXT = 6, 24


def _expected_row(before: list, tokens: list, window: int, full_rows: bool) -> list:
    """The module's rule written out: known tokens from start, then window + 1 cells of -1, clipped to the row."""
    width = MAX_CONTEXT + 1
    row = list(before)
    start = 0 if full_rows else max(len(tokens) - window, 0)
    for col in range(start, min(len(tokens) + window + 1, width)):
        row[col] = tokens[col] if col < len(tokens) else -1
    return row


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 4),
    full_rows=st.booleans(),
    # Half the batches have every request at least window long: the regular decode grid.
    rows=st.one_of(
        st.lists(st.lists(st.integers(0, 999), max_size=MAX_CONTEXT + 1), min_size=1, max_size=MAX_REQS),
        st.lists(st.lists(st.integers(0, 999), min_size=4, max_size=MAX_CONTEXT - 4), min_size=1, max_size=MAX_REQS),
    ),
    staging_cells=st.sampled_from([1, 8, 1000]),
    seed=st.integers(0, 2**16),
)
def test_staged_cells_update_the_table_as_the_rules_say(window, full_rows, rows, staging_cells, seed):
    table = ExpectedTokenTable(MAX_REQS, MAX_CONTEXT, "cpu", window)
    rng = np.random.default_rng(seed)
    table.table.copy_(torch.from_numpy(rng.integers(-1, 999, size=table.table.shape)))
    before = table.table.clone()
    pool_rows = torch.from_numpy(rng.permutation(MAX_REQS)[: len(rows)].astype(np.int64))
    staging = Staging({"token_cells": (np.int64, (3 * staging_cells,))}, "cpu")
    staging.begin()
    batch = SimpleNamespace(batch_size=len(rows), canary_token_ids=rows)
    n = table.stage(batch, full_rows, staging.host("token_cells"))
    if 0 < 3 * n <= 3 * staging_cells:
        staging.upload(24 * n)
    table.scatter(pool_rows, staging.device_view("token_cells"), n)

    want = before.clone()
    for b, tokens in enumerate(rows):
        r = int(pool_rows[b])
        want[r] = torch.tensor(_expected_row(before[r].tolist(), tokens, window, full_rows))
    assert torch.equal(table.table, want)


def test_too_long_token_list_names_the_request():
    table = ExpectedTokenTable(2, 4, "cpu", 2)
    out = np.zeros(300, dtype=np.int64)
    batch = SimpleNamespace(batch_size=2, canary_token_ids=[[1], [1, 2, 3, 4, 5, 6]])
    with pytest.raises(ValueError, match=r"canary_token_ids\[1\] has 6 tokens; the table holds 5"):
        table.stage(batch, False, out)


def test_index_runs_group_consecutive_sub_forwards():
    assert index_runs([0, 1, 2]) == [(0, 3)]
    assert index_runs([2, 0]) == [(0, 1), (2, 3)]
    assert index_runs([1]) == [(1, 2)]


def test_plan_of_non_consecutive_sub_forwards_and_disable_after(dev):
    runner = MiniRunner(server_args(speculative_num_steps=4), device=dev)
    manager = runner.canary_manager
    ops = RecordingOps(manager, runner.model)
    sched = Scheduler(runner)
    mark_init_finished(manager)
    reqs = [sched.new_request([1, 2, 3]), sched.new_request([4, 5, 6, 7, 8])]
    runner.forward(sched.extend(reqs))
    batch = sched.decode(reqs, [9, 10])
    batch.forward_mode = ForwardMode.DECODE
    with manager.with_ops_outside_graph([0, 2], batch):
        for i in (0, 2):
            with manager.with_active_single_forward_manager(i):
                manager.pre_ops_maybe_inside_graph(batch.input_ids)
                manager.post_ops_maybe_inside_graph()
        plans = [sfm.plan for sfm in manager.single_forward_managers]
        assert [int(p.enabled[0]) for p in plans] == [1, 0, 1]
        assert [int(p.num_reqs[0]) for p in plans] == [2, 0, 2]
    seq = batch.seq_lens.tolist()
    by_index = {c["index"]: c for c in ops.calls if c["kernel"] == "pre"}
    # Sub-forward i of a multi-step decode verifies up to position seq_len - 1 + i and writes one.
    assert by_index[0]["prefix"] == [s - 1 for s in seq] and by_index[2]["prefix"] == [s + 1 for s in seq]
    assert by_index[0]["extend"] == by_index[2]["extend"] == [1, 1]
    assert by_index[2]["req_pool_indices"] == [r.row for r in reqs]
    # Leaving the block turned every sub-forward off on the device.
    assert [int(p.enabled[0]) for p in plans] == [0, 0, 0]
