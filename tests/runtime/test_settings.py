"""Settings come from server args, then the environment; every bad value names its setting."""

import pytest

from canary_instrument.runtime import install_canary, load_settings

from .mini_engine import MiniRunner, ReqToTokenPool, TinyModel, server_args


def test_defaults_leave_the_canary_off():
    settings = load_settings(None, {})
    assert settings.mode == "none" and not settings.enabled
    assert settings.real_kv == "none" and settings.token_check
    assert settings.swa_divergence_interval == 0


def test_server_args_win_over_environment():
    env = {"KV_CANARY": "raise", "KV_CANARY_REAL_KV": "all", "KV_CANARY_RING_SIZE": "64"}
    settings = load_settings(server_args(kv_canary="log", kv_canary_real_kv=None), env)
    assert settings.mode == "log"  # server arg
    assert settings.real_kv == "all"  # server arg None -> environment
    assert settings.ring_size == 64


def test_sglang_names_come_before_the_older_aliases():
    from types import SimpleNamespace

    args = SimpleNamespace(kv_canary="log", kv_canary_real_data="partial", kv_canary_real_kv="all")
    env = {"SGLANG_KV_CANARY_RING_CAPACITY": "64", "KV_CANARY_RING_SIZE": "32",
           "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "5", "KV_CANARY_STATS_INTERVAL": "9"}
    settings = load_settings(args, env)
    assert (settings.real_kv, settings.ring_size, settings.stats_interval) == ("partial", 64, 5)
    # An absent sglang name falls through to the alias.
    assert load_settings(SimpleNamespace(kv_canary="log", kv_canary_real_kv="all"), {"KV_CANARY_RING_SIZE": "32"}) \
        .ring_size == 32


def test_sweep_and_perturbation_settings_are_read_validated_and_supported():
    from types import SimpleNamespace

    from canary_instrument.runtime.setup.settings import unsupported_upstream

    env = {"KV_CANARY_SWEEP_SLOTS": "512", "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.25",
           "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "3"}
    settings = load_settings(SimpleNamespace(kv_canary="log", kv_canary_sweep_interval=4), env)
    assert (settings.sweep_interval, settings.sweep_slots) == (4, 512)
    assert settings.perturb.rates == (("real_kv_used", 0.25),) and settings.perturb.warmup_steps == 3
    assert unsupported_upstream(settings, env) == []  # both are features here, not ignored knobs
    assert load_settings(None, {"KV_CANARY_SWEEP_INTERVAL": "16"}).sweep_interval == 16
    assert (load_settings(None, {}).sweep_interval, load_settings(None, {}).perturb.enabled) == (0, False)
    with pytest.raises(ValueError, match=r"server_args.kv_canary_sweep_interval must be an integer >= 0"):
        load_settings(SimpleNamespace(kv_canary_sweep_interval=-1), {})
    with pytest.raises(ValueError, match=r"KV_CANARY_SWEEP_SLOTS must be an integer >= 1; got '0'"):
        load_settings(None, {"KV_CANARY_SWEEP_SLOTS": "0"})
    with pytest.raises(ValueError, match=r"server_args.kv_canary_perturb: unknown perturbation 'flip'"):
        load_settings(SimpleNamespace(kv_canary_perturb="flip=0.5"), {})


def test_swa_divergence_interval_from_server_args():
    assert load_settings(server_args(kv_canary_swa_divergence_interval=7), {}).swa_divergence_interval == 7
    with pytest.raises(ValueError, match="server_args.kv_canary_swa_divergence_interval"):
        load_settings(server_args(kv_canary_swa_divergence_interval=-3), {})


def test_environment_only_knobs():
    env = {"KV_CANARY": "LOG", "KV_CANARY_SWA_DIVERGENCE_INTERVAL": "20", "KV_CANARY_TOKEN_CHECK": "off"}
    settings = load_settings(None, env)
    assert settings.mode == "log" and settings.swa_divergence_interval == 20 and not settings.token_check


@pytest.mark.parametrize(
    "args, env, named",
    [
        ({"kv_canary": "loud"}, {}, "server_args.kv_canary"),
        ({"kv_canary_real_kv": "half"}, {}, "server_args.kv_canary_real_kv"),
        ({"kv_canary": None}, {"KV_CANARY": "verbose"}, "KV_CANARY"),
        ({}, {"KV_CANARY_RING_SIZE": "0"}, "KV_CANARY_RING_SIZE"),
        ({}, {"KV_CANARY_RING_SIZE": "many"}, "KV_CANARY_RING_SIZE"),
        ({}, {"KV_CANARY_SWA_DIVERGENCE_INTERVAL": "-1"}, "KV_CANARY_SWA_DIVERGENCE_INTERVAL"),
        ({}, {"KV_CANARY_TOKEN_CHECK": "maybe"}, "KV_CANARY_TOKEN_CHECK"),
        ({"kv_canary_stats_interval": True}, {}, "server_args.kv_canary_stats_interval"),
        ({"kv_canary_backend": "cuda"}, {}, "server_args.kv_canary_backend"),
    ],
)
def test_invalid_setting_raises_value_error_naming_it(args, env, named):
    base = {"kv_canary": "log", "speculative_num_steps": None}
    base.update(args)
    with pytest.raises(ValueError, match=named):
        load_settings(server_args(**base), env)


def test_install_returns_none_when_off_and_leaves_the_model_alone():
    runner = MiniRunner(server_args(kv_canary="none"))
    assert runner.canary_manager is None
    assert "forward" not in runner.model.__dict__


def test_install_reads_the_environment_when_server_args_lack_the_field(monkeypatch):
    monkeypatch.setenv("KV_CANARY", "raise")
    runner = MiniRunner(server_args(kv_canary=None))
    assert runner.canary_manager is not None and runner.canary_manager.settings.mode == "raise"


class UnknownPool:
    def __init__(self):
        self.buffers = []


class UnknownPoolRunner:
    def __init__(self):
        self.server_args = server_args()
        self.is_draft_worker = False
        self.req_to_token_pool = ReqToTokenPool(4, 16, "cpu")
        self.token_to_kv_pool = UnknownPool()
        self.model = TinyModel(self.token_to_kv_pool)


def test_unknown_pool_is_an_error_naming_the_pool_class():
    runner = UnknownPoolRunner()
    with pytest.raises(ValueError, match=r"unsupported KV pool .*UnknownPool"):
        install_canary(server_args=runner.server_args, model_runner=runner)


def test_swa_pool_needs_a_window():
    with pytest.raises(ValueError, match="sliding_window_size"):
        MiniRunner(server_args(), layout="swa", window=0)


def test_negative_speculative_steps_named():
    with pytest.raises(ValueError, match="speculative_num_steps"):
        MiniRunner(server_args(speculative_num_steps=-2))


@pytest.mark.parametrize("layout, groups", [("mha", 2), ("mla", 1), ("swa", 4)])
def test_pool_attached_by_structure(layout, groups):
    manager = MiniRunner(server_args(), layout=layout).canary_manager
    assert manager.state.layout == layout
    assert len(manager.state.groups) == groups
    # Real-KV words are a live view of layer 0's row, not a copy.
    group = manager.state.groups[0]
    assert group.kv_words is not None and group.kv_words.dtype.itemsize == 8


@pytest.mark.parametrize("steps, expected", [(None, 1), (1, 1), (2, 1), (3, 2), (5, 4)])
def test_one_sub_forward_manager_per_inner_draft_step(steps, expected):
    runner = MiniRunner(server_args(speculative_num_steps=steps), is_draft_worker=True)
    assert runner.canary_manager.num_single_forward == expected
    assert runner.canary_manager.state.token_offset == 1


def test_target_runner_has_no_token_offset():
    assert MiniRunner(server_args()).canary_manager.state.token_offset == 0
