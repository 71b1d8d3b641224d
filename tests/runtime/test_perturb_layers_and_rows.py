"""The perturbation kinds of every-layer fingerprints and complete rows, on pools of three layers per half.

Each runs decode forwards the way the manager does (hooks around the reference passes) and is scored from
its injection line and the violation records: a flip in any layer is reported within ``LAYERS`` of the
request's forwards (the rotation), a zeroed fingerprint as ``unwritten``, a high token bit as ``row_bits``.
"""

import pytest
import torch
from kernels.scenario import make_scenario

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.passes.layers import layer_count, layer_words
from canary_instrument.runtime.perturb import score
from canary_instrument.runtime.perturb.perturber import ManagerView

from .test_perturb_kinds import ForwardBatch, ForwardMode, perturber, records

LAYERS = 3
LAYOUTS = [("mha", True), ("mla", False), ("swa", True)]


def decode_scenario(layout, v_half, seed):
    # Slots exist for LAYERS + 1 decode forwards per request.
    return make_scenario(layout, "partial", v_half, seed=seed, num_reqs=3, max_bs=3, prefix_lens=[12, 7, 9],
                         extend_lens=[LAYERS + 1] * 3, swa_window=5, max_context=40, full_slots=128, swa_slots=64,
                         share_prefix=False, layers=LAYERS, expected_tokens=False)


def decode_batch(sc, forward):
    prefix = [r.prefix + forward for r in sc.requests]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(prefix),
        input_ids=sc.input_ids[: len(prefix)],
        req_pool_indices=sc.plan.req_pool_indices[: len(prefix)].clone(),
        seq_lens=torch.tensor([p + 1 for p in prefix]),
        positions=torch.tensor(prefix),
        out_cache_loc=torch.tensor([r.full_slots[p] for r, p in zip(sc.requests, prefix)], dtype=torch.int64),
        extend_prefix_lens_cpu=None,
        extend_seq_lens_cpu=None,
        seq_lens_cpu=torch.tensor([p + 1 for p in prefix]),
    )


def run_decodes(sc, kind, seed, forwards):
    """``forwards`` decode forwards with ``kind`` armed for the first one only; (injection, violations)."""
    sc.plan.extend_lens[:3] = 1
    pert = perturber(kind, sc.state, seed)
    found = []
    for forward in range(forwards):
        view = ManagerView(step=forward + 1)
        fb = decode_batch(sc, forward)
        since = int(sc.state.ring_count[0])
        if forward == 0:
            pert.before_forward(view, fb)
        reference.pre_forward(sc.state, sc.plan, sc.input_ids)
        reference.post_forward(sc.state, sc.plan)
        if forward == 0:
            pert.after_forward(view, fb)
        found += records(sc.state, forward + 1, since)
        sc.plan.prefix_lens[:3] += 1
    [injection] = pert.drain()
    assert injection.applied
    return injection, found


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_real_kv_used_flips_the_layer_its_forward_checks(layout, v_half, seed):
    sc = decode_scenario(layout, v_half, seed)
    injection, found = run_decodes(sc, "real_kv_used", seed, forwards=1)
    group = {"full": 0, "swa": 1}[injection.group]
    half = next(g for g in sc.state.groups if (g.group, g.half) == (group, {"k": 0, "v": 1}[injection.half]))
    assert injection.get("layer") == (int(sc.state.layer_cursor[injection.req]) - 1) % layer_count(half)
    result = score([injection], found)
    assert (result.reported, result.kinds["real_kv_used"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_a_kept_flip_in_any_layer_is_reported_within_the_rotation(layout, v_half, seed):
    sc = decode_scenario(layout, v_half, seed)
    injection, found = run_decodes(sc, "real_kv_layer", seed, forwards=LAYERS)
    result = score([injection], found)
    assert result.reported == 1 and result.unattributed == []
    assert result.kinds["real_kv_layer"].delays[0] < LAYERS


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_a_zeroed_fingerprint_over_changed_kv_is_reported_unwritten(layout, v_half, seed):
    sc = decode_scenario(layout, v_half, seed)
    injection, found = run_decodes(sc, "fingerprint_zeroed", seed, forwards=LAYERS)
    result = score([injection], found)
    assert result.reported == 1 and result.unattributed == []
    delay = result.kinds["fingerprint_zeroed"].delays[0]
    assert delay == 0 if injection.get("layer") == 0 else delay < LAYERS
    assert {r for v in found for r in v.reasons} <= {"unwritten", "fingerprint"}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout,v_half", LAYOUTS)
def test_a_high_token_bit_is_reported_by_that_forward(layout, v_half, seed):
    sc = decode_scenario(layout, v_half, seed)
    words = [layer_words(g, 0).clone() for g in sc.state.groups]
    injection, found = run_decodes(sc, "row_high_bit", seed, forwards=1)
    assert 32 <= injection.get("bit") < 64
    assert all(torch.equal(layer_words(g, 0), w) for g, w in zip(sc.state.groups, words)), "the KV is untouched"
    result = score([injection], found)
    assert (result.reported, result.kinds["row_high_bit"].delays, result.unattributed) == (1, [0], [])
    assert all(v.reasons == {"row_bits"} for v in found)
