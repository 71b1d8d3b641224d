"""Canary settings read from a real sglang 0.5.20 ``ServerArgs`` (built by sglang's own CLI parser, as
``python -m sglang.launch_server`` builds it) and from sglang's ``SGLANG_KV_CANARY_*`` variables."""

from __future__ import annotations

import argparse
import logging

import pytest

from canary_instrument.runtime import load_settings
from canary_instrument.runtime.setup.settings import unsupported_upstream


@pytest.fixture(scope="module")
def parse(sg):
    parser = argparse.ArgumentParser()
    sg.server_args.ServerArgs.add_cli_args(parser)

    def build(*cli):
        return sg.server_args.ServerArgs.from_cli_args(parser.parse_args(["--model-path", "unused", *cli]))

    return build


def test_server_args_from_the_command_line(parse):
    args = parse("--kv-canary", "raise", "--kv-canary-real-data", "all", "--kv-canary-sweep-interval", "4")
    settings = load_settings(args, {})
    assert (settings.mode, settings.real_kv, settings.sweep_interval) == ("raise", "all", 4)
    assert settings.enabled


def test_defaults_of_a_real_server_args_leave_the_canary_off(parse):
    settings = load_settings(parse(), {"KV_CANARY": "log"})
    # sglang declares kv_canary (default "none"), and a declared server arg wins over the environment.
    assert settings.mode == "none" and not settings.enabled


def test_sglang_environment_variables(parse):
    env = {
        "SGLANG_KV_CANARY_RING_CAPACITY": "4096",
        "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "100",
        "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "0",
        "SGLANG_KV_CANARY_SWA_DIVERGENCE_STATS_INTERVAL": "50",
    }
    settings = load_settings(parse("--kv-canary", "log"), env)
    assert (settings.ring_size, settings.stats_interval, settings.token_check, settings.swa_divergence_interval) == (
        4096, 100, False, 50
    )


def test_sglang_names_win_over_the_older_aliases(parse):
    env = {"SGLANG_KV_CANARY_RING_CAPACITY": "64", "KV_CANARY_RING_SIZE": "32", "KV_CANARY_REAL_KV": "all"}
    settings = load_settings(parse("--kv-canary", "log", "--kv-canary-real-data", "partial"), env)
    assert (settings.ring_size, settings.real_kv) == (64, "partial")
    assert load_settings(parse("--kv-canary", "log"), {"KV_CANARY_RING_SIZE": "32"}).ring_size == 32


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SGLANG_KV_CANARY_RING_CAPACITY": "many"}, r"SGLANG_KV_CANARY_RING_CAPACITY must be an integer >= 1"),
        ({"SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "-5"},
         r"SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS must be an integer >= 0"),
        ({"SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "maybe"},
         r"SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT must be a boolean"),
    ],
)
def test_a_bad_value_names_the_setting(parse, env, message):
    with pytest.raises(ValueError, match=message):
        load_settings(parse("--kv-canary", "log"), env)


def test_a_bad_server_arg_set_after_parsing_names_the_attribute(parse):
    args = parse("--kv-canary", "log")
    args.kv_canary_real_data = "half"  # e.g. from a config file or a programmatic ServerArgs
    with pytest.raises(ValueError, match=r"server_args.kv_canary_real_data must be one of none, partial, all"):
        load_settings(args, {})


def test_sglang_parser_itself_refuses_a_bad_mode(parse, capsys):
    with pytest.raises(SystemExit):
        parse("--kv-canary", "loud")
    assert "--kv-canary: invalid choice: 'loud'" in capsys.readouterr().err


def test_upstream_knobs_without_a_counterpart_are_named_in_one_warning(sg, parse, caplog, monkeypatch):
    from .harness import RealRunner

    env = {"SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1", "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "0"}
    args = parse("--kv-canary", "log", "--kv-canary-sweep-interval", "8")
    found = unsupported_upstream(load_settings(args, env), env)
    # The sweep interval is a feature here (the idle-cache sweep), so only the write-input assert is named.
    assert [f.split("=")[0] for f in found] == ["SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT"]
    caplog.set_level(logging.WARNING, logger="canary_instrument.runtime")
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    RealRunner(sg, args, "mha")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1" in warnings[0]
