"""The token oracle (runtime/features/token_oracle.py): upstream's hash, the sampler override on the reference engine,
and the write-time input check that catches a wrong input token where nothing else looks (a decode riding in a mixed
batch)."""

from __future__ import annotations

import ast
import importlib.util
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from canary_instrument.runtime.setup.settings import load_settings, unsupported_upstream
from canary_instrument.runtime.features.token_oracle import (
    TokenOracle,
    generalized_request_id,
    oracle_token_int,
    oracle_tokens,
    request_id,
    seed_word,
)

from .refsgl_harness import instrumented

UPSTREAM = Path.home() / ".cache/canary-instrument/sglang/0.5.23/sglang/srt"
ORACLE_ON = {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}


def _upstream_file(relative: str) -> Path:
    path = UPSTREAM / relative
    if not path.is_file():
        pytest.skip(f"sglang 0.5.23's {relative} is not in the release cache ({UPSTREAM})")
    return path


def test_seed_zero_gives_upstreams_hash_oracle_tokens():
    spec = importlib.util.spec_from_file_location("upstream_oracle", _upstream_file("kv_canary/token_oracle/oracle.py"))
    upstream = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = upstream  # its frozen dataclass resolves annotations through its module
    try:
        spec.loader.exec_module(upstream)
    finally:
        del sys.modules[spec.name]
    gen = torch.Generator().manual_seed(5)
    rids = torch.randint(-(1 << 62), 1 << 62, (4096,), generator=gen, dtype=torch.int64)
    positions = torch.randint(0, 1 << 20, (4096,), generator=gen, dtype=torch.int64)
    for vocab in (7, 128, 151936):
        theirs = upstream.HashOracle(vocab_size=vocab).expected_tokens(generalized_req_ids=rids, positions=positions)
        assert torch.equal(oracle_tokens(rids, positions, vocab).to(torch.int32), theirs)


def test_request_id_is_upstreams_rid_hash():
    source = _upstream_file("model_executor/forward_batch_info.py").read_text()
    function = next(node for node in ast.parse(source).body
                    if isinstance(node, ast.FunctionDef) and node.name == "_stable_hash_str_to_i64")
    namespace: dict = {"hashlib": __import__("hashlib")}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "forward_batch_info.py", "exec"), namespace)
    for rid in ("0", "a3f9c1e2b7d04e5f8a6b1c2d3e4f5a6b", "chat-ß-1"):
        assert request_id(rid) == namespace["_stable_hash_str_to_i64"](rid)
    # PD disaggregation: the bootstrap room, as upstream's select_generalized_req_ids, so both servers agree.
    assert generalized_request_id(SimpleNamespace(rid="x", bootstrap_room=77)) == 77
    assert generalized_request_id(SimpleNamespace(rid="x", bootstrap_room=None)) == request_id("x")


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_tensor_hash_matches_the_integer_reference(seed):
    rids = [request_id(str(i)) for i in range(20)] + [-1, 0, (1 << 63) - 1, -(1 << 63)]
    positions = list(range(len(rids)))
    got = oracle_tokens(torch.tensor(rids), torch.tensor(positions), 1000, seed_word(seed)).tolist()
    assert got == [oracle_token_int(r, p, 1000, seed) for r, p in zip(rids, positions)]
    if seed:
        assert got != oracle_tokens(torch.tensor(rids), torch.tensor(positions), 1000).tolist()


def test_settings_follow_upstreams_names(monkeypatch):
    class Args:
        sampling_backend = "token_oracle"

    assert load_settings(Args(), {}).token_oracle
    Args.sampling_backend = "flashinfer"  # another backend named: off, whatever the variable says (as upstream)
    assert not load_settings(Args(), ORACLE_ON).token_oracle
    assert load_settings(None, ORACLE_ON).token_oracle  # an engine with no sampling_backend: the variable decides
    off = {**ORACLE_ON, "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "0", "SGLANG_KV_CANARY_TOKEN_ORACLE_SEED": "9"}
    settings = load_settings(None, off)
    assert (settings.token_oracle_check, settings.token_oracle_seed) == (False, 9)
    # The input check asked for without the oracle has nothing to compare with: named in the install warning.
    lonely = {"SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"}
    assert unsupported_upstream(load_settings(None, lonely), lonely) == [
        "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1 (the oracle's input check needs the token oracle: "
        "--sampling-backend token_oracle)"
    ]
    assert unsupported_upstream(load_settings(None, {**ORACLE_ON, **lonely}), {**ORACLE_ON, **lonely}) == []
    with pytest.raises(ValueError, match="SGLANG_KV_CANARY_TOKEN_ORACLE_SEED must be an integer >= 0"):
        load_settings(None, {"SGLANG_KV_CANARY_TOKEN_ORACLE_SEED": "-3"})


def test_ring_append_keeps_the_first_ring_size_records_and_counts_all():
    ring = torch.full((4, 8), -7, dtype=torch.int64)
    count = torch.tensor([3], dtype=torch.int64)
    oracle = TokenOracle(rows=4, device="cpu", vocab=10, seed=0, check=True, ring=ring, ring_count=count[0],
                         enabled=torch.ones(1, dtype=torch.int32))
    bad = torch.tensor([0, 1, 1, 0, 1, 1, 1, 1, 0, 1], dtype=torch.bool)  # 7 bad lanes, ring of 4
    records = torch.arange(10, dtype=torch.int64).unsqueeze(1).repeat(1, 8)
    oracle._append(bad, records)
    assert int(count) == 10
    # Records land at (3 + k) % 4 for the first four bad lanes (1, 2, 4, 5), in order.
    assert ring[:, 0].tolist() == [2, 4, 5, 1]
    oracle._append(torch.zeros(10, dtype=torch.bool), records)
    assert int(count) == 10 and ring[:, 0].tolist() == [2, 4, 5, 1]


# ---------------------------------------------------------------------- the reference engine


def _engine(monkeypatch, oracle: bool, **args):
    if oracle:
        monkeypatch.setenv("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "1")
    return instrumented("mha", enable_mixed_chunk=True, **args)


def _riding_decode_fault(harness, log):
    """Before the first mixed forward: change the input token of the first request decoding in it."""
    engine = harness.engine

    def corrupt(forward_batch):
        if log or not forward_batch.forward_mode.is_mixed():
            return
        lens = list(forward_batch.extend_seq_lens_cpu)
        rows = forward_batch.req_pool_indices.tolist()
        riding = {r.req_pool_idx: r for r in engine.scheduler.running}
        for i, (row, n) in enumerate(zip(rows, lens)):
            if row in riding and n == 1:
                at = sum(lens[:i])
                old = int(forward_batch.input_ids[at])
                forward_batch.input_ids[at] = (old + 1) % engine.server_args.vocab_size
                log.append((row, int(forward_batch.positions[at]), old))
                return

    harness.hooks.before_forward.append(corrupt)


def _run_until_mixed(harness):
    scheduler = harness.engine.scheduler
    first = scheduler.add_request(list(range(3, 21)), 12)
    violations = []
    for _ in range(3):  # prefill, then two pure decodes
        harness.engine.step()
        violations += harness.manager.flush()
    scheduler.add_request(list(range(40, 110)), 3)  # longer than a chunk: mixed batches carry `first`
    for _ in range(6):
        harness.engine.step()
        violations += harness.manager.flush()
    return first, violations


def test_oracle_samples_upstreams_tokens_and_a_clean_mixed_run_reports_nothing(monkeypatch):
    harness = _engine(monkeypatch, oracle=True)
    first, violations = _run_until_mixed(harness)
    assert violations == []
    assert harness.engine.scheduler.stats.mixed_batches >= 1
    oracle = harness.manager.token_oracle
    rid = int(oracle.rid[first.req_pool_idx])
    prompt = len(first.origin_input_ids)
    assert int(oracle.prompt_len[first.req_pool_idx]) == prompt  # learnt from its first decode
    assert first.output_ids == [oracle_token_int(rid, prompt + i, 128) for i in range(len(first.output_ids))]


def test_a_wrong_token_fed_to_a_decode_riding_in_a_mixed_batch_is_caught_only_by_the_oracle(monkeypatch, canary_log):
    harness = _engine(monkeypatch, oracle=True)
    injected: list = []
    _riding_decode_fault(harness, injected)
    _, violations = _run_until_mixed(harness)
    (row, position, old), = injected
    assert [(v.kernel, sorted(v.reasons), v.req_pool_index, v.position) for v in violations] == [
        ("token_oracle", ["oracle"], row, position)
    ]
    assert violations[0].expected == old and violations[0].stored == (old + 1) % 128
    logging.getLogger().info("%s", violations[0].format())
    assert "kernel=token_oracle group=full half=k reason=oracle" in canary_log.text

    monkeypatch.delenv("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE")
    without = instrumented("mha", enable_mixed_chunk=True)
    assert without.manager.token_oracle is None
    missed: list = []
    _riding_decode_fault(without, missed)
    _, violations = _run_until_mixed(without)
    assert len(missed) == 1 and violations == []  # the sampled-token check reads pure decodes only


def test_a_wrong_token_in_a_pure_decode_is_caught_by_the_oracle_and_the_sampled_token_check(monkeypatch):
    harness = _engine(monkeypatch, oracle=True)
    scheduler = harness.engine.scheduler
    req = scheduler.add_request(list(range(5, 15)), 6)
    harness.engine.step()
    harness.engine.step()
    assert harness.manager.flush() == []

    def corrupt(forward_batch):
        if forward_batch.forward_mode.is_decode():
            forward_batch.input_ids[0] = (int(forward_batch.input_ids[0]) + 3) % 128
            harness.hooks.before_forward.clear()

    harness.hooks.before_forward.append(corrupt)
    harness.engine.step()
    violations = harness.manager.flush()
    found = {(v.kernel, r) for v in violations for r in v.reasons}
    assert found == {("token_oracle", "oracle"), ("post_forward", "token")}
    assert {v.position for v in violations} == {len(req.origin_input_ids) + 1}  # prefill, decode, this decode


def test_oracle_check_off_keeps_the_sampler(monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT", "0")
    harness = _engine(monkeypatch, oracle=True)
    injected: list = []
    _riding_decode_fault(harness, injected)
    first, violations = _run_until_mixed(harness)
    assert len(injected) == 1 and violations == []
    oracle = harness.manager.token_oracle
    rid = int(oracle.rid[first.req_pool_idx])
    assert first.output_ids[0] == oracle_token_int(rid, len(first.origin_input_ids), 128)


def test_the_oracle_refuses_speculative_decoding(monkeypatch):
    monkeypatch.setenv("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "1")
    with pytest.raises(ValueError, match=r"the token oracle is not supported with speculative decoding "
                                         r"\(server_args.speculative_algorithm='EAGLE'\)"):
        instrumented("mha", speculative_algorithm="EAGLE")


@pytest.mark.gpu
def test_the_check_runs_inside_a_cuda_graph_without_a_host_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from canary_instrument.runtime.passes.state import PlanInputs

    dev = torch.device("cuda")
    ring = torch.zeros((16, 8), dtype=torch.int64, device=dev)
    status = torch.zeros(1, dtype=torch.int64, device=dev)
    oracle = TokenOracle(rows=4, device=dev, vocab=128, seed=0, check=True, ring=ring, ring_count=status[0],
                         enabled=torch.ones(1, dtype=torch.int32, device=dev))
    oracle.note_rows([1, 2])
    oracle.apply()
    oracle.prompt_len.copy_(torch.tensor([-1, 3, 3, -1], device=dev))

    class Mode:
        def is_decode(self):
            return True

    rpi = torch.tensor([1, 2], device=dev)
    positions = torch.tensor([5, 7], device=dev)
    input_ids = oracle_tokens(oracle.rid[rpi], positions, 128)
    batch = SimpleNamespace(forward_mode=Mode(), batch_size=2, positions=positions, req_pool_indices=rpi,
                            out_cache_loc=torch.tensor([9, 10], device=dev))
    plan = PlanInputs(2, rpi, positions, None, oracle.enabled, extend_const=1)
    oracle.check(plan, input_ids, batch)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            oracle.check(plan, input_ids, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph.replay()
    torch.cuda.synchronize()
    assert int(status) == 0
    input_ids[1] += 1  # the replay re-reads the static input
    graph.replay()
    torch.cuda.synchronize()
    assert int(status) == 1 and ring[0, 3].item() == 7 and ring[0, 7].item() == 2
