"""The sample inbox: the sampler's tensors queued by address, filed into the sampled-token table by
the next pre-forward pass, on both backends (Triton through its interpreter without a GPU)."""

import pytest
import torch

from canary_instrument.runtime import reference
from canary_instrument.runtime.sample_inbox import SLOTS, SampleInbox
from canary_instrument.runtime.state import TOKEN
from canary_instrument.runtime.triton_ops import TritonCanaryOps
from tests.kernels.scenario import make_scenario, violations

BACKENDS = ["torch", "triton"]


def _ops(backend):
    return reference.TorchCanaryOps() if backend == "torch" else TritonCanaryOps(block=8, programs=3)


def _decode(device):
    """Three requests each writing one new position, their table emptied: the sampler's tokens
    (what each request was fed) come only through the inbox."""
    sc = make_scenario("mha", "none", seed=5, num_reqs=3, max_bs=5, prefix_lens=[6, 9, 4], extend_lens=[1, 1, 1],
                       share_prefix=False, device=device)
    sc.state.sampled_tokens.fill_(-1)
    sc.state.sample_inbox = SampleInbox(device)
    rows = torch.tensor([r.pool_index for r in sc.requests], dtype=torch.int64, device=device)
    fed = torch.tensor([r.tokens[r.prefix] for r in sc.requests], dtype=torch.int32, device=device)
    return sc, rows, fed


def _forward(sc, ops):
    ops.pre_forward(sc.state, sc.plan, sc.input_ids)
    ops.post_forward(sc.state, sc.plan)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_queued_sample_is_filed_and_checked_by_the_next_forward(device, backend):
    sc, rows, fed = _decode(device)
    ops = _ops(backend)
    assert sc.state.sample_inbox.send(rows, fed + 1, tag=0, forwards_done=0)  # not what was fed
    assert sc.state.sampled_tokens.tolist() == [-1] * sc.state.sampled_tokens.shape[0]  # nothing on the device yet
    ops.pre_forward(sc.state, sc.plan, sc.input_ids)
    assert sc.state.sampled_tokens[rows].tolist() == (fed + 1).tolist()
    ops.post_forward(sc.state, sc.plan)
    assert {(r[3], r[6]) for r in violations(sc.state)} == {(r.prefix, TOKEN) for r in sc.requests}
    assert sc.state.sampled_tokens.tolist() == [-1] * sc.state.sampled_tokens.shape[0]  # consumed
    assert int(sc.state.sample_inbox.taken[0]) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sample_queued_after_the_pass_was_launched_waits_for_the_next(device, backend):
    sc, rows, fed = _decode(device)
    ops = _ops(backend)
    # Tagged for forward 1: the host queued it after launching forward 0, whose tokens it may not
    # have sampled yet when forward 0's pass runs.
    sc.state.sample_inbox.send(rows, fed + 1, tag=1, forwards_done=0)
    _forward(sc, ops)
    assert violations(sc.state) == [] and int(sc.state.sample_inbox.taken[0]) == 0
    ops.pre_forward(sc.state, sc.plan, sc.input_ids)  # forward 1 files it
    assert sc.state.sampled_tokens[rows].tolist() == (fed + 1).tolist()
    assert int(sc.state.sample_inbox.taken[0]) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_entries_are_filed_in_order_with_any_int_dtype_and_stride(device, backend):
    sc, rows, fed = _decode(device)
    ops = _ops(backend)
    inbox = sc.state.sample_inbox
    table_rows = sc.state.sampled_tokens.shape[0]
    # A first sample for every row, then a later one for two rows, as int64 tokens read through a
    # strided view; a padding row (0) and a row past the table are skipped.
    inbox.send(rows, torch.full_like(fed, 7), tag=0, forwards_done=0)
    later = torch.stack([fed.long(), torch.zeros_like(fed.long())], dim=1)[:2, 0]
    inbox.send(rows[:2].to(torch.int32), later, tag=0, forwards_done=0)
    pad = torch.tensor([0, table_rows], dtype=torch.int64, device=device)
    inbox.send(pad, torch.tensor([5, 5], dtype=torch.int32, device=device), tag=0, forwards_done=0)
    ops.pre_forward(sc.state, sc.plan, sc.input_ids)
    table = sc.state.sampled_tokens.tolist()
    assert [table[int(r)] for r in rows] == fed[:2].tolist() + [7]
    assert table[0] == -1 and int(inbox.taken[0]) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_right_tokens_fed_back_stay_clean_over_many_steps(device, backend):
    sc, rows, fed = _decode(device)
    ops = _ops(backend)
    for step in range(SLOTS + 3):  # the ring wraps
        assert sc.state.sample_inbox.send(rows, fed, tag=step, forwards_done=step)
        _forward(sc, ops)
    assert violations(sc.state) == []
    assert int(sc.state.sample_inbox.taken[0]) == SLOTS + 3


def test_a_slot_is_not_reused_before_its_entry_is_known_filed():
    inbox = SampleInbox("cpu")
    rows = torch.tensor([1, 2])
    tokens = torch.tensor([3, 4], dtype=torch.int32)
    for n in range(SLOTS):
        assert inbox.send(rows, tokens, tag=n, forwards_done=0)
    # Slot 0 holds the entry for forward 0: only once the host has read forward 0 finished may it go.
    assert not inbox.send(rows, tokens, tag=SLOTS, forwards_done=0)
    assert inbox.dropped == 1 and inbox.sent == SLOTS
    assert inbox.send(rows, tokens, tag=SLOTS, forwards_done=1)
    assert inbox.kept[0][0] is rows and inbox.sent == SLOTS + 1


def test_another_dtype_is_refused():
    inbox = SampleInbox("cpu")
    with pytest.raises(TypeError, match="int32 or int64"):
        inbox.send(torch.tensor([1]), torch.tensor([1.0]), tag=0, forwards_done=0)
