"""The torch hash primitives agree bit for bit with the pure-Python uint64 spec."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from canary_instrument.runtime.passes import hashing

u64 = st.integers(min_value=0, max_value=hashing.U64)


@settings(max_examples=50, deadline=None)
@given(st.lists(u64, min_size=1, max_size=16))
def test_mix64_matches_spec(values):
    got = hashing.mix64(torch.tensor([hashing.as_signed(v) for v in values]))
    assert [v & hashing.U64 for v in got.tolist()] == [hashing.mix64_int(v) for v in values]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40), st.integers(0, 1 << 20))
def test_scanned_chain_matches_serial_chain(tokens, start):
    positions = torch.arange(start, start + len(tokens))
    a, b = hashing.affine(torch.tensor(tokens), positions)
    a_scan, b_scan = hashing.affine_inclusive_scan(a, b)
    seed = hashing.as_signed(hashing.CHAIN_SEED)
    scanned = [(v & hashing.U64) for v in (a_scan * seed + b_scan).tolist()]
    assert scanned == hashing.chain_int(tokens, start)[1:]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(u64, min_size=3, max_size=3), min_size=1, max_size=8))
def test_fingerprint_matches_spec_and_is_never_zero(rows):
    got = hashing.fingerprint(torch.tensor([[hashing.as_signed(w) for w in row] for row in rows]))
    want = [hashing.fingerprint_int(row) for row in rows]
    assert [v & hashing.U64 for v in got.tolist()] == want
    assert 0 not in want


def test_next_link_is_one_chain_step():
    tokens, positions = [17, 99, 4], [0, 1, 2]
    links = hashing.chain_int(tokens)
    got = hashing.next_link(
        torch.tensor(tokens), torch.tensor(positions), torch.tensor([hashing.as_signed(x) for x in links[:3]])
    )
    assert [v & hashing.U64 for v in got.tolist()] == links[1:]
