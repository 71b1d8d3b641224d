"""The token oracle on sglang 0.5.20's real classes: ``--sampling-backend token_oracle`` from sglang's own parser,
rows bound to real ``Req`` objects through the real ``ReqToTokenPool.alloc(reqs)``, and a retracted request's
re-prefill of its own outputs, where a wrong token is caught at write time (nothing else checks an extend's inputs)."""

from __future__ import annotations

import argparse
import importlib
from array import array

import pytest

from canary_instrument.runtime import mark_init_finished
from canary_instrument.runtime.features.token_oracle import oracle_token_int, request_id

from .harness import VOCAB, RealRunner, Req, Scheduler


@pytest.fixture
def oracle_args(sg, monkeypatch):
    # sglang offers the token_oracle sampling backend only with its variable set when the parser is built.
    monkeypatch.setenv("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "1")
    parser = argparse.ArgumentParser()
    sg.server_args.ServerArgs.add_cli_args(parser)
    cli = ["--model-path", "unused", "--kv-canary", "log", "--sampling-backend", "token_oracle"]
    return sg.server_args.ServerArgs.from_cli_args(parser.parse_args(cli))


@pytest.fixture(scope="module")
def server_args(sg):
    parser = argparse.ArgumentParser()
    sg.server_args.ServerArgs.add_cli_args(parser)

    def build(*cli):
        return sg.server_args.ServerArgs.from_cli_args(parser.parse_args(["--model-path", "unused", *cli]))

    return build


def _real_req(rid: str, prompt: list):
    schedule_batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
    return schedule_batch.Req(rid, "", array("i", prompt), sampling.SamplingParams(max_new_tokens=16))


def _admit(runner, real) -> Req:
    (row,) = runner.req_to_token_pool.alloc([real])  # the real pool's binding of rows to requests, wrapped
    return Req(row=row, tokens=list(real.origin_input_ids))


def test_the_oracle_samples_per_request_and_position_from_sglangs_own_settings(sg, oracle_args):
    assert oracle_args.sampling_backend == "token_oracle"
    runner = RealRunner(sg, oracle_args, "mha")
    mark_init_finished(runner.canary_manager)
    oracle = runner.canary_manager.token_oracle
    assert oracle is not None
    sched = Scheduler(sg, runner)
    reals = [_real_req("req-a", [5, 6, 7, 8, 9]), _real_req("req-b", [11, 12, 13])]
    reqs = [_admit(runner, r) for r in reals]
    next_tokens = sched.step(sched.extend(reqs))
    for _ in range(4):
        next_tokens = sched.step(sched.decode(reqs, next_tokens))
    assert runner.canary_manager.flush() == []
    for real, req in zip(reals, reqs):
        prompt = len(real.origin_input_ids)
        assert int(oracle.prompt_len[req.row]) == prompt
        outputs = req.tokens[prompt:] + [next_tokens[reqs.index(req)]]
        assert outputs == [oracle_token_int(request_id(real.rid), prompt + i, VOCAB) for i in range(len(outputs))]


def test_a_wrong_token_in_a_retracted_requests_re_prefill_is_caught_at_write_time(sg, oracle_args):
    runner = RealRunner(sg, oracle_args, "mha")
    manager = runner.canary_manager
    mark_init_finished(manager)
    sched = Scheduler(sg, runner)
    real = _real_req("req-retracted", [3, 1, 4, 1, 5, 9, 2, 6])
    req = _admit(runner, real)
    next_tokens = sched.step(sched.extend([req]))
    for _ in range(5):
        next_tokens = sched.step(sched.decode([req], next_tokens))
    assert manager.flush() == []
    # Retraction: the request gives back its row and slots, and comes back later with prompt + outputs to
    # prefill again, in chunks, on whatever row the real pool hands out.
    done = req.tokens + next_tokens
    sched.finish(req)
    runner.req_to_token_pool.free(real)
    again = _admit(runner, real)
    again.tokens = list(done)
    bad_position = len(real.origin_input_ids) + 3
    again.tokens[bad_position] = (again.tokens[bad_position] + 1) % VOCAB  # the scheduler's copy is wrong
    tail = None
    while len(again.slots) < len(again.tokens):
        tail = sched.step(sched.extend([again], chunk=4))
    violations = manager.flush()
    assert [(v.kernel, sorted(v.reasons), v.position, v.req_pool_index) for v in violations] == [
        ("token_oracle", ["oracle"], bad_position, again.row)
    ]
    assert violations[0].expected == done[bad_position]
    assert tail == [oracle_token_int(request_id(real.rid), len(done), VOCAB)]


def test_without_the_oracle_the_same_re_prefill_passes_every_other_check(sg, server_args):
    args = server_args("--kv-canary", "log")
    runner = RealRunner(sg, args, "mha")
    manager = runner.canary_manager
    assert manager.token_oracle is None
    mark_init_finished(manager)
    sched = Scheduler(sg, runner)
    real = _real_req("req-retracted", [3, 1, 4, 1, 5, 9, 2, 6])
    req = _admit(runner, real)
    next_tokens = sched.step(sched.extend([req]))
    for _ in range(5):
        next_tokens = sched.step(sched.decode([req], next_tokens))
    done = req.tokens + next_tokens
    sched.finish(req)
    runner.req_to_token_pool.free(real)
    again = _admit(runner, real)
    again.tokens = list(done)
    again.tokens[len(real.origin_input_ids) + 3] += 1
    while len(again.slots) < len(again.tokens):
        sched.step(sched.extend([again], chunk=4))
    assert manager.flush() == []

