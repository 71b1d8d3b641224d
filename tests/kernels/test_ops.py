"""get_ops picks Triton on CUDA and the torch reference elsewhere; KV_CANARY_BACKEND overrides both."""

import pytest

from canary_instrument.runtime.passes.ops import get_ops, resolve_backend


def test_device_default(monkeypatch):
    monkeypatch.delenv("KV_CANARY_BACKEND", raising=False)
    assert resolve_backend("cuda:0") == "triton"
    assert resolve_backend("cpu") == "torch"
    assert resolve_backend("cpu", "triton") == "triton"
    assert get_ops("cpu").name == "torch"
    assert get_ops("cpu", backend="triton").name == "triton"


def test_environment_overrides_caller_and_device(monkeypatch):
    monkeypatch.setenv("KV_CANARY_BACKEND", "torch")
    assert resolve_backend("cuda", "triton") == "torch"
    monkeypatch.setenv("KV_CANARY_BACKEND", "Triton ")
    assert get_ops("cpu").name == "triton"


@pytest.mark.parametrize("env,arg", [("cuda", None), ("", "numba")])
def test_unknown_backend_names_the_setting(monkeypatch, env, arg):
    monkeypatch.setenv("KV_CANARY_BACKEND", env)
    with pytest.raises(ValueError, match="KV_CANARY_BACKEND" if env else "backend="):
        resolve_backend("cpu", arg)
