"""Perturbation settings: off by default, upstream's per-kind variables, a kind=rate spec, clear errors."""

from types import SimpleNamespace

import pytest

from canary_instrument.runtime.perturb import KINDS, PerturbSettings, load_perturb_settings


def test_off_by_default():
    settings = load_perturb_settings(None, {})
    assert settings == PerturbSettings() and not settings.enabled
    assert load_perturb_settings(SimpleNamespace(kv_canary_perturb="off"), {}).rates == ()


def test_upstream_per_kind_variables_and_the_spec_that_overrides_them():
    env = {
        "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.01",
        "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.5",
        "SGLANG_KV_CANARY_PERTURB_SEED": "7",
        "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "0",
        "SGLANG_KV_CANARY_PERTURB_TARGET_GROUP": "SWA",
        "SGLANG_KV_CANARY_PERTURB": "real_kv_used=0, next_token_swap=0.25",
    }
    settings = load_perturb_settings(None, env)
    assert settings.rates == (("req_to_token", 0.01), ("next_token_swap", 0.25))
    assert (settings.seed, settings.warmup_steps, settings.target_group) == (7, 0, "swa")
    assert settings.stop_file == ""
    assert load_perturb_settings(None, {**env, "SGLANG_KV_CANARY_PERTURB_STOP_FILE": " /tmp/x.stop "}).stop_file == "/tmp/x.stop"
    # Server args win over the environment, setting by setting.
    args = SimpleNamespace(kv_canary_perturb="all=0.1", kv_canary_perturb_seed=3, kv_canary_perturb_warmup_steps=None)
    settings = load_perturb_settings(args, env)
    assert settings.rates == tuple((k, 0.1) for k in KINDS) and settings.seed == 3 and settings.warmup_steps == 0
    assert settings.kinds == KINDS and settings.rate("real_kv_used") == 0.1


@pytest.mark.parametrize("env,message", [
    ({"SGLANG_KV_CANARY_PERTURB": "flip=0.1"}, "SGLANG_KV_CANARY_PERTURB: unknown perturbation 'flip'; known: all, "),
    ({"SGLANG_KV_CANARY_PERTURB": "req_to_token"}, "expected kind=rate entries separated by commas; got 'req_to_token'"),
    ({"SGLANG_KV_CANARY_PERTURB": "req_to_token=2"}, r"SGLANG_KV_CANARY_PERTURB \(req_to_token\) must be a number in \[0, 1\]"),
    ({"SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "often"}, "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB must be a number"),
    ({"SGLANG_KV_CANARY_PERTURB_SEED": "-1"}, "SGLANG_KV_CANARY_PERTURB_SEED must be an integer >= 0; got '-1'"),
    ({"SGLANG_KV_CANARY_PERTURB_TARGET_GROUP": "mla"}, "must be one of any, full, swa; got 'mla'"),
])
def test_bad_values_name_the_setting(env, message):
    with pytest.raises(ValueError, match=message):
        load_perturb_settings(None, env)


def test_bad_server_arg_names_the_server_arg():
    with pytest.raises(ValueError, match=r"server_args.kv_canary_perturb_warmup_steps must be an integer >= 0"):
        load_perturb_settings(SimpleNamespace(kv_canary_perturb_warmup_steps=True), {})
