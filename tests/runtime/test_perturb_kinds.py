"""Each perturbation kind on small real tensors: what it corrupts, what it restores, and that the canary's
reference passes (and the sweep) report it, scored from the injection and violation records.

Pools come from the per-forward scenario builder (rows written and fingerprinted as earlier passes
leave them); batches are the reference engine's ForwardBatch with the host copies sglang provides.
"""

import os
import random
import sys
from types import SimpleNamespace

import pytest
import torch
from kernels.scenario import make_scenario

from canary_instrument.runtime.passes import reference
from canary_instrument.runtime.perturb import Injection, PerturbSettings, score
from canary_instrument.runtime.perturb.base import KindContext, device_position, device_row
from canary_instrument.runtime.perturb.batch import BatchFacts, batch_facts
from canary_instrument.runtime.perturb.perturber import ManagerView, Perturber
from canary_instrument.runtime.passes.state import GROUP_SWA
from canary_instrument.runtime.features.sweep import Sweeper
from canary_instrument.runtime.reports.violations import Violation

from .radix_trees import CompressedRadixCache

ENGINE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "golden", "engine"))
sys.path.insert(0, ENGINE_ROOT)
try:
    from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
finally:
    sys.path.remove(ENGINE_ROOT)


def scenario(layout="mha", decode=False, v_half=True, seed=3, prefix_lens=(12, 7, 9), same_history=False):
    n = 3
    sc = make_scenario(layout, "partial", v_half, seed=seed, num_reqs=n, max_bs=4, prefix_lens=list(prefix_lens),
                       extend_lens=[1, 1, 1] if decode else [3, 1, 4], swa_window=5, max_context=40,
                       full_slots=128, swa_slots=64, unfingerprinted=0.0, share_prefix=False,
                       same_history=same_history)
    return sc


def forward_batch(sc, decode=False):
    reqs = sc.requests
    prefix = [r.prefix for r in reqs]
    extend = [r.extend for r in reqs]
    tokens = sum(extend)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        batch_size=len(reqs),
        input_ids=sc.input_ids[:tokens],
        req_pool_indices=sc.plan.req_pool_indices[: len(reqs)].clone(),
        seq_lens=torch.tensor([p + e for p, e in zip(prefix, extend)]),
        positions=torch.cat([torch.arange(p, p + e) for p, e in zip(prefix, extend)]),
        out_cache_loc=torch.tensor([s for r in reqs for s in r.full_slots[r.prefix:]], dtype=torch.int64),
        extend_prefix_lens_cpu=None if decode else prefix,
        extend_seq_lens_cpu=None if decode else extend,
        seq_lens_cpu=torch.tensor([p + e for p, e in zip(prefix, extend)]),
    )


def perturber(kind, state, seed=0, target_group="any"):
    settings = PerturbSettings(rates=((kind, 1.0),), seed=seed, warmup_steps=0, target_group=target_group)
    return Perturber(settings, state)


def records(state, step, since=0):
    count = int(state.ring_count[0])
    return [Violation.from_record(r, step) for r in state.ring[since:count].tolist()]


def one_step(sc, fb, pert, step=1, cache=None):
    """One forward the way the manager runs it: hooks around the reference passes."""
    since = int(sc.state.ring_count[0])
    view = ManagerView(step=step, radix_cache=cache)
    pert.before_forward(view, fb)
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)  # the bracketed model forward: pre-ops, model,
    reference.post_forward(sc.state, sc.plan)  # post-ops
    pert.after_forward(view, fb)
    pert.at_step_end(view)
    return records(sc.state, step, since)


def next_step(sc):
    """The following forward: everything written so far is prefix now (verify only)."""
    sc.plan.prefix_lens[:3] += sc.plan.extend_lens[:3]
    sc.plan.extend_lens[:3] = 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["mha", "mla", "swa"])
def test_req_to_token_remap_is_reported_that_forward_and_restored(layout, seed):
    sc = scenario(layout, v_half=layout != "mla")
    fb = forward_batch(sc)
    table = sc.state.req_to_token.clone()
    pert = perturber("req_to_token", sc.state, seed)
    found = one_step(sc, fb, pert)
    assert torch.equal(sc.state.req_to_token, table), "the entry must be restored after the forward"
    [injection] = pert.drain()
    req, p, q = injection.req, injection.position, injection.get("new_position")
    assert (injection.slot, injection.get("new_slot")) == (int(table[req, p]), int(table[req, q]))
    assert injection.applied and req in fb.req_pool_indices.tolist()
    result = score([injection], found)
    assert (result.reported, result.kinds["req_to_token"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout,target", [("mha", "any"), ("mla", "full"), ("swa", "swa"), ("swa", "full")])
def test_real_kv_used_flip_is_reported_that_forward_and_restored(layout, target, seed):
    sc = scenario(layout, v_half=layout != "mla", seed=seed)
    fb = forward_batch(sc)
    kv = [g.kv_words.clone() for g in sc.state.groups]
    pert = perturber("real_kv_used", sc.state, seed, target)
    view = ManagerView(step=4)
    pert.before_forward(view, fb)
    changed = [i for i, g in enumerate(sc.state.groups) if not torch.equal(g.kv_words, kv[i])]
    assert len(changed) == 1
    group = sc.state.groups[changed[0]]
    assert (target == "any") or (group.group == (GROUP_SWA if target == "swa" else 0))
    diff = (group.kv_words != kv[changed[0]]).nonzero().tolist()
    assert len(diff) == 1 and diff[0][1] < 2, "one word inside the 16 fingerprinted bytes"
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    pert.after_forward(view, fb)
    assert all(torch.equal(g.kv_words, k) for g, k in zip(sc.state.groups, kv)), "restored after the forward"
    [injection] = pert.drain()
    assert injection.slot == diff[0][0] and injection.step == 4
    request = sc.requests[fb.req_pool_indices.tolist().index(injection.req)]
    lowest = request.prefix - 5 if group.group == GROUP_SWA else 0  # the SWA group reads the last window only
    assert max(0, lowest) <= injection.position < request.prefix
    result = score([injection], records(sc.state, 4))
    assert (result.reported, result.kinds["real_kv_used"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_real_kv_post_forward_flip_is_reported_by_the_next_read(layout, seed):
    sc = scenario(layout, seed=seed)
    fb = forward_batch(sc)
    pert = perturber("real_kv_post_forward", sc.state, seed)
    assert one_step(sc, fb, pert, step=1) == []  # the flip comes after this forward's own checks
    [injection] = pert.drain()
    req_row = fb.req_pool_indices.tolist().index(injection.req)
    request = sc.requests[req_row]
    assert request.prefix <= injection.position < request.prefix + request.extend
    next_step(sc)
    found = records_after(sc, 2)
    result = score([injection], found)
    assert (result.reported, result.kinds["real_kv_post_forward"].delays, result.unattributed) == (1, [1], [])


@pytest.mark.parametrize("seed", range(6))
def test_real_kv_post_forward_in_the_swa_group_flips_a_position_the_window_keeps(seed):
    # Prefills longer than the window (5): the SWA group's next pass verifies only each request's last 5
    # positions, and the engine releases the rest unread; a flip must land where it can be reported.
    sc = make_scenario("swa", "partial", seed=seed, num_reqs=3, max_bs=4, prefix_lens=[2, 7, 0],
                       extend_lens=[14, 1, 12], swa_window=5, max_context=40, full_slots=128, swa_slots=64,
                       unfingerprinted=0.0, share_prefix=False)
    fb = forward_batch(sc)
    pert = perturber("real_kv_post_forward", sc.state, seed, target_group="swa")
    assert one_step(sc, fb, pert, step=1) == []
    [injection] = pert.drain()
    request = sc.requests[fb.req_pool_indices.tolist().index(injection.req)]
    end = request.prefix + request.extend
    assert max(request.prefix, end - 5) <= injection.position < end
    next_step(sc)
    result = score([injection], records_after(sc, 2))
    assert (result.reported, result.kinds["real_kv_post_forward"].delays, result.unattributed) == (1, [1], [])


def records_after(sc, step):
    since = int(sc.state.ring_count[0])
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    return records(sc.state, step, since)


@pytest.mark.parametrize("seed", range(4))
def test_next_token_swap_is_a_token_violation_at_both_positions(seed):
    sc = scenario("mha", decode=True, seed=seed)
    fb = forward_batch(sc, decode=True)
    before = fb.input_ids.clone()
    pert = perturber("next_token_swap", sc.state, seed)
    found = one_step(sc, fb, pert)
    [injection] = pert.drain()
    assert injection.applied and sorted(before.tolist()) == sorted(fb.input_ids.tolist())
    assert int((before != fb.input_ids).sum()) == 2
    token_hits = {(v.req_pool_index, v.position) for v in found if "token" in v.reasons}
    assert token_hits == {(injection.req, injection.position), (injection.get("other_req"), injection.get("other_position"))}
    result = score([injection], found)
    assert (result.reported, result.kinds["next_token_swap"].delays, result.unattributed) == (1, [0], [])


def test_next_token_swap_of_equal_tokens_is_logged_as_not_applied():
    sc = scenario("mha", decode=True)
    fb = forward_batch(sc, decode=True)
    fb.input_ids.fill_(5)  # every request's next token is the same: a swap changes nothing
    pert = perturber("next_token_swap", sc.state)
    pert.before_forward(ManagerView(step=1), fb)
    [injection] = pert.drain()
    assert not injection.applied and fb.input_ids.tolist() == [5, 5, 5]
    assert score([injection], []).not_applied == 1
    extend = forward_batch(scenario("mha"))  # and it swaps only the next tokens of decode (and verify) batches
    pert.before_forward(ManagerView(step=1), extend)
    assert pert.drain() == []


def test_next_token_swap_picks_a_partner_whose_token_differs():
    sc = scenario("mha", decode=True)
    fb = forward_batch(sc, decode=True)
    fb.input_ids.copy_(torch.tensor([7, 7, 9]))  # only request row 2 can change rows 0 and 1
    pert = perturber("next_token_swap", sc.state, seed=1)
    for step in range(1, 4):
        before = fb.input_ids.clone()
        pert.before_forward(ManagerView(step=step), fb)
        [injection] = pert.drain()
        assert injection.applied and int((before != fb.input_ids).sum()) == 2
        assert {injection.get("token"), injection.get("other_token")} == {7, 9}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", ["mla", "swa"])
def test_real_kv_unused_cache_flip_is_found_by_the_sweep(layout, seed):
    sc = scenario(layout, v_half=False, seed=seed)
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    reference.post_forward(sc.state, sc.plan)
    sc.state.ring_count.zero_()
    cache = CompressedRadixCache()
    for req in sc.requests:  # the requests finished: their positions sit in the cache, unlocked
        cache.insert(req.tokens[: len(req.full_slots)], req.full_slots)
    pert = perturber("real_kv_unused_cache", sc.state, seed, "swa" if layout == "swa" else "any")
    pert.at_step_end(ManagerView(step=3, radix_cache=cache))
    [injection] = pert.drain()
    assert injection.req == -1 and injection.step == 3
    sweeper = Sweeper(sc.state, interval=1, slots_per_sweep=1000)
    sweeper.maybe_sweep(4, cache)
    result = score([injection], records(sc.state, 4))
    if not injection.applied:  # an SWA flip drawn outside the window finds no SWA slot
        assert layout == "swa" and result.injected == 0 and result.not_applied == 1
        return
    assert (result.reported, result.kinds["real_kv_unused_cache"].delays, result.unattributed) == (1, [1], [])


def test_warm_up_rates_and_unusable_settings():
    sc = scenario("mha")
    fb = forward_batch(sc)
    settings = PerturbSettings(rates=(("req_to_token", 1.0),), warmup_steps=2)
    pert = Perturber(settings, sc.state)
    for step in (1, 2):
        pert.before_forward(ManagerView(step), fb)
        pert.after_forward(ManagerView(step), fb)
    assert pert.drain() == []
    pert.before_forward(ManagerView(3), fb)
    pert.after_forward(ManagerView(3), fb)
    assert [i.step for i in pert.drain()] == [3]
    rare = Perturber(PerturbSettings(rates=(("req_to_token", 0.2),), warmup_steps=0, seed=1), sc.state)
    for step in range(1, 201):
        rare.before_forward(ManagerView(step), fb)
        rare.after_forward(ManagerView(step), fb)
    assert 20 <= len(rare.drain()) <= 60

    none_kv = make_scenario("mha", "none", seed=1)
    with pytest.raises(ValueError, match="real_kv_used needs kv_canary_real_kv=partial or all"):
        perturber("real_kv_used", none_kv.state)
    no_tokens = make_scenario("mha", "partial", seed=1, expected_tokens=False)
    no_tokens.state.sampled_tokens = None
    with pytest.raises(ValueError, match="next_token_swap needs the token check"):
        perturber("next_token_swap", no_tokens.state)
    with pytest.raises(ValueError, match="target group 'swa' needs an SWA pool; this pool is mha"):
        perturber("real_kv_post_forward", sc.state, target_group="swa")
    draft = make_scenario("mha", "partial", seed=1, token_offset=1)
    with pytest.raises(ValueError, match="target model runner's manager"):
        perturber("req_to_token", draft.state)


def test_limit_makes_a_one_shot_fault():
    # The fault matrix's pattern: arm one kind at rate 1, fire at the first forward with a target, never again.
    sc = scenario("mha", decode=True)
    fb = forward_batch(sc, decode=True)
    pert = Perturber(PerturbSettings(rates=(("next_token_swap", 1.0),), warmup_steps=0), sc.state, limit=1)
    for step in range(1, 6):
        pert.before_forward(ManagerView(step), fb)
        pert.after_forward(ManagerView(step), fb)
    assert [i.step for i in pert.drain()] == [1] and pert.counts == {"next_token_swap": 1}
    with pytest.raises(ValueError, match="limit must be >= 1 or None"):
        Perturber(PerturbSettings(rates=(("next_token_swap", 1.0),)), sc.state, limit=0)


def test_a_stop_file_ends_the_injections_and_says_at_which_step(tmp_path, caplog):
    # serve.py's drain creates the file once its workload is done, then serves the sweep's tail: from the first
    # hook that finds it, nothing is drawn or injected, and one line names the step.
    sc = scenario("mha", decode=True)
    fb = forward_batch(sc, decode=True)
    stop = tmp_path / "perturb-stop"
    pert = Perturber(PerturbSettings(rates=(("next_token_swap", 1.0),), warmup_steps=0, stop_file=str(stop)),
                     sc.state)
    with caplog.at_level("WARNING", logger="canary_instrument.runtime"):
        for step in range(1, 7):
            if step == 4:
                stop.touch()
            pert.before_forward(ManagerView(step), fb)
            pert.after_forward(ManagerView(step), fb)
            pert.at_step_end(ManagerView(step))
    assert [i.step for i in pert.drain()] == [1, 2, 3] and pert.stopped_at == 4
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kv_canary_perturb_stopped=")]
    assert stopped == [f"kv_canary_perturb_stopped= step=4 file={stop}"]
    stop.unlink()  # it stays stopped
    pert.before_forward(ManagerView(7), fb)
    assert pert.drain() == []


# ---------------------------------------------------------------- target verify as real sglang hands it over
# sglang's spec-v2 worker with overlap scheduling and an attention backend that needs no host lengths:
# seq_lens_cpu and extend_prefix_lens_cpu are None, there is no num_tokens_per_req, the draft width is
# spec_info.draft_token_num, and the prefix exists only as the device tensor seq_lens.

WIDTH = 3  # draft tokens per request


class DeviceOnly(torch.Tensor):
    """A CPU tensor standing in for a GPU one: a host read (which would synchronise the GPU) raises."""

    _READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy,
              torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.__float__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls._READS:
            raise AssertionError(f"a perturbation read a device value on the host ({func.__name__})")
        return super().__torch_function__(func, types, args, kwargs or {})


def verify_scenario(layout="mha", seed=3):
    return make_scenario(layout, "partial", layout != "mla", seed=seed, num_reqs=3, max_bs=4, prefix_lens=[12, 7, 9],
                         extend_lens=[WIDTH] * 3, swa_window=5, max_context=40, full_slots=128, swa_slots=64,
                         unfingerprinted=0.0, share_prefix=False)


def verify_batch(sc):
    """The scenario's forward as a TARGET_VERIFY batch of real sglang: its tensors (views of the scenario's)
    refuse host reads."""
    reqs = sc.requests
    device = lambda t: t.as_subclass(DeviceOnly)  # noqa: E731
    return ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=len(reqs),
        input_ids=device(sc.input_ids[: WIDTH * len(reqs)]),
        req_pool_indices=device(sc.plan.req_pool_indices[: len(reqs)].clone()),
        seq_lens=device(torch.tensor([r.prefix for r in reqs])),  # a verify's seq_lens: the prefix
        positions=device(torch.cat([torch.arange(r.prefix, r.prefix + WIDTH) for r in reqs])),
        out_cache_loc=device(torch.tensor([s for r in reqs for s in r.full_slots[r.prefix:]], dtype=torch.int64)),
        extend_prefix_lens_cpu=None, extend_seq_lens_cpu=None, seq_lens_cpu=None, num_tokens_per_req=None,
        spec_info=SimpleNamespace(draft_token_num=WIDTH),
    )


def owner(sc, injection):
    """The scenario's request (its host-known truth) that an injection's req-pool index names."""
    return {r.pool_index: r for r in sc.requests}[injection.req]


def logged(injection):
    """The injection as score_log reads it back from its line (the line carries the position)."""
    [parsed] = Injection.find_all(injection.format())
    return parsed


def test_verify_batch_facts_without_host_copies():
    sc = verify_scenario()
    fb = verify_batch(sc)
    facts = batch_facts(fb)
    assert (facts.mode, facts.prefix, facts.new, facts.size, facts.tokens) == ("verify", None, (WIDTH,) * 3, 3, 9)
    assert facts.device_prefix is not None and facts.device_prefix.data_ptr() == fb.seq_lens.data_ptr()
    fb.seq_lens_cpu = torch.tensor([12, 7, 9])  # with a host copy: host facts, the width still from spec_info
    assert batch_facts(fb) == BatchFacts("verify", (12, 7, 9), (WIDTH,) * 3)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_req_to_token_in_a_verify_without_host_copies(layout, seed):
    sc = verify_scenario(layout, seed)
    fb = verify_batch(sc)
    table = sc.state.req_to_token.clone()
    pert = perturber("req_to_token", sc.state, seed)
    found = one_step(sc, fb, pert)
    assert torch.equal(sc.state.req_to_token, table), "the entry must be restored after the forward"
    [injection] = pert.drain()
    request = owner(sc, injection)
    p, q = injection.position, injection.get("new_position")
    assert 0 <= p < request.prefix - 1 and 0 <= q < request.prefix and q != p
    assert (injection.slot, injection.get("new_slot")) == (request.full_slots[p], request.full_slots[q])
    assert injection.applied and [n for n, _ in injection.extra] == ["new_position", "new_slot"]
    result = score([logged(injection)], found)
    assert (result.reported, result.kinds["req_to_token"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout,target", [("mha", "any"), ("swa", "swa"), ("swa", "full")])
def test_real_kv_used_in_a_verify_without_host_copies(layout, target, seed):
    sc = verify_scenario(layout, seed)
    fb = verify_batch(sc)
    kv = [g.kv_words.clone() for g in sc.state.groups]
    pert = perturber("real_kv_used", sc.state, seed, target)
    pert.before_forward(ManagerView(step=4), fb)
    [group] = [g for g, k in zip(sc.state.groups, kv) if not torch.equal(g.kv_words, k)]
    reference.pre_forward(sc.state, sc.plan, sc.input_ids)
    pert.after_forward(ManagerView(step=4), fb)
    assert all(torch.equal(g.kv_words, k) for g, k in zip(sc.state.groups, kv)), "restored after the forward"
    [injection] = pert.drain()
    request = owner(sc, injection)
    lowest = request.prefix - 5 if group.group == GROUP_SWA else 0  # the SWA group reads the last window only
    assert max(0, lowest) <= injection.position < request.prefix
    slot = request.full_slots[injection.position]
    if group.group == GROUP_SWA:
        slot = int(sc.state.swa_mapping[slot])
    assert injection.applied and injection.slot == slot and "position" not in dict(injection.extra)
    result = score([logged(injection)], records(sc.state, 4))
    assert (result.reported, result.kinds["real_kv_used"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_real_kv_post_forward_in_a_verify_without_host_copies(layout, seed):
    sc = verify_scenario(layout, seed)
    fb = verify_batch(sc)
    pert = perturber("real_kv_post_forward", sc.state, seed)
    assert one_step(sc, fb, pert, step=1) == []
    [injection] = pert.drain()
    request = owner(sc, injection)
    assert injection.position == request.prefix  # the first verified position: sure to be kept
    slot = request.full_slots[request.prefix]
    if injection.group == "swa":
        slot = int(sc.state.swa_mapping[slot])
    assert injection.applied and injection.slot == slot
    next_step(sc)
    result = score([logged(injection)], records_after(sc, 2))
    assert (result.reported, result.kinds["real_kv_post_forward"].delays, result.unattributed) == (1, [1], [])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["mha", "swa"])
def test_next_token_swap_in_a_verify_without_host_copies(layout, seed):
    sc = verify_scenario(layout, seed)
    fb = verify_batch(sc)
    before = sc.input_ids.clone()  # fb.input_ids is a view of it
    pert = perturber("next_token_swap", sc.state, seed)
    found = one_step(sc, fb, pert)
    [injection] = pert.drain()
    assert injection.applied and int((before != sc.input_ids).sum()) == 2
    first = {r.pool_index: (before[WIDTH * i], r.prefix) for i, r in enumerate(sc.requests)}
    (token, position), (other_token, other_position) = first[injection.req], first[injection.get("other_req")]
    assert (injection.position, injection.get("other_position")) == (position, other_position)
    assert (injection.get("token"), injection.get("other_token")) == (token, other_token)
    names = ["other_position", "other_req", "other_slot", "token", "other_token"]
    assert [n for n, _ in injection.extra] == names + (["swa_slot", "other_swa_slot"] if layout == "swa" else [])
    token_hits = {(v.req_pool_index, v.position) for v in found if "token" in v.reasons}
    assert token_hits == {(injection.req, position), (injection.get("other_req"), other_position)}
    result = score([logged(injection)], found)
    assert (result.reported, result.kinds["next_token_swap"].delays, result.unattributed) == (1, [0], [])


@pytest.mark.parametrize("kind,prefix_lens", [("req_to_token", [1, 0]), ("real_kv_used", [0, 0])])
def test_verify_without_host_copies_and_no_target_is_logged_as_not_applied(kind, prefix_lens):
    # Prefixes too short for a target (req_to_token needs 2 positions, real_kv_used 1): the device finds
    # nothing, changes nothing, and the line says applied=0.
    sc = make_scenario("mha", "partial", seed=1, num_reqs=2, max_bs=2, prefix_lens=prefix_lens,
                       extend_lens=[WIDTH] * 2, max_context=40, full_slots=128, unfingerprinted=0.0,
                       share_prefix=False)
    fb = verify_batch(sc)
    table, kv = sc.state.req_to_token.clone(), sc.state.groups[0].kv_words.clone()
    pert = perturber(kind, sc.state)
    pert.before_forward(ManagerView(step=1), fb)
    assert torch.equal(sc.state.req_to_token, table) and torch.equal(sc.state.groups[0].kv_words, kv)
    [injection] = pert.drain()
    assert not injection.applied and score([injection], []).not_applied == 1


@pytest.mark.parametrize("seed", range(3))
def test_device_position_is_uniform_in_its_range_and_invalid_when_empty(seed):
    ctx = KindContext(state=None, rng=random.Random(seed), target_group="any")
    low, high = torch.tensor([3]), torch.tensor([8])
    drawn = [device_position(ctx, low, high) for _ in range(500)]
    counts = torch.bincount(torch.cat([p for p, _ in drawn]), minlength=8).tolist()
    assert counts[:3] == [0, 0, 0] and min(counts[3:]) >= 70 and all(bool(v) for _, v in drawn)
    position, valid = device_position(ctx, torch.tensor([4]), torch.tensor([4]))
    assert (position.dtype, valid.dtype, int(position), bool(valid)) == (torch.int64, torch.bool, 4, False)
    row, valid = device_row(ctx, torch.tensor([False, True, False, True]))
    assert int(row) in (1, 3) and bool(valid)
    assert not bool(device_row(ctx, torch.tensor([False, False]))[1])


def test_real_kv_kinds_never_flip_a_half_that_holds_no_kv():
    # The full half of an SWA pool with no full layers reads one zero row for every slot: a flip there would
    # change every slot at once and report what no engine did.
    from canary_instrument.runtime.perturb.base import pick_group

    sc = make_scenario("swa", "partial", True, seed=3, layerless_full=True)
    ctx = KindContext(sc.state, random.Random(0), "any")
    picked = {(g.group, g.half) for g in (pick_group(ctx) for _ in range(200))}
    assert picked == {(GROUP_SWA, 0), (GROUP_SWA, 1)}
    assert pick_group(KindContext(sc.state, random.Random(0), "full")) is None
