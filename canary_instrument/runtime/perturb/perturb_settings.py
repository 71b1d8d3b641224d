"""Perturbation settings: which self-test corruptions run, how often, from which seed, after how many steps.

Read from the engine's server args, else the environment (names follow upstream sglang's
``SGLANG_KV_CANARY_PERTURB_*`` variables), validated once; every bad value raises a
``ValueError`` naming the setting. All perturbations are off unless a rate is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# One per perturbation kind, in the order they are documented (docs/runtime.md, section 13).
KINDS = ("req_to_token", "real_kv_used", "real_kv_unused_cache", "real_kv_post_forward", "next_token_swap",
         "real_kv_layer", "fingerprint_zeroed", "row_high_bit", "req_row_swap", "write_slot", "premature_free")
TARGET_GROUPS = ("any", "full", "swa")
OFF = ("", "off", "none", "0")

SPEC_ARG, SPEC_ENV = "kv_canary_perturb", "SGLANG_KV_CANARY_PERTURB"
SEED_ARG, SEED_ENV = "kv_canary_perturb_seed", "SGLANG_KV_CANARY_PERTURB_SEED"
WARMUP_ARG, WARMUP_ENV = "kv_canary_perturb_warmup_steps", "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS"
GROUP_ARG, GROUP_ENV = "kv_canary_perturb_target_group", "SGLANG_KV_CANARY_PERTURB_TARGET_GROUP"
STOP_ARG, STOP_ENV = "kv_canary_perturb_stop_file", "SGLANG_KV_CANARY_PERTURB_STOP_FILE"


def rate_env(kind: str) -> str:
    """Upstream's per-kind variable, e.g. ``SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB``."""
    return f"SGLANG_KV_CANARY_PERTURB_{kind.upper()}_PROB"


@dataclass(frozen=True)
class PerturbSettings:
    """Rates are probabilities per opportunity (a forward for the batch kinds, a step for the cache kind)."""

    rates: tuple = ()  # ((kind, rate), ...) for kinds with a rate > 0, in KINDS order
    seed: int = 0
    warmup_steps: int = 50  # steps 1 .. warmup_steps are never perturbed (upstream's default)
    target_group: str = "any"  # which canary group the real-KV kinds flip: any | full | swa
    # A path: once a file exists there, no further injection is armed (a harness's end-of-run reads then find
    # every injection made before it); "" = never stop.
    stop_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.rates)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.rates)

    def rate(self, kind: str) -> float:
        return dict(self.rates).get(kind, 0.0)


def parse_rate(name: str, value: Any) -> float:
    try:
        rate = float(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be a number in [0, 1]; got {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1]; got {value!r}")
    return rate


def parse_spec(name: str, value: Any) -> dict[str, float]:
    """``kind=rate,kind=rate`` (``all=rate`` sets every kind; ``off`` or empty sets none)."""
    text = str(value).strip()
    if text.lower() in OFF:
        return {}
    rates: dict[str, float] = {}
    for item in text.split(","):
        kind, sep, rate = item.strip().partition("=")
        kind = kind.strip().lower()
        if not sep:
            raise ValueError(f"{name}: expected kind=rate entries separated by commas; got {item.strip()!r}")
        if kind == "all":
            rates.update({k: parse_rate(f"{name} (all)", rate) for k in KINDS})
        elif kind in KINDS:
            rates[kind] = parse_rate(f"{name} ({kind})", rate)
        else:
            raise ValueError(f"{name}: unknown perturbation {kind!r}; known: all, {', '.join(KINDS)}")
    return rates


def int_at_least(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int (a string is parsed; a bool is refused), at least ``minimum``; ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    try:
        number = value if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return number


def _target_group(name: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text not in TARGET_GROUPS:
        raise ValueError(f"{name} must be one of {', '.join(TARGET_GROUPS)}; got {value!r}")
    return text


def _source(server_args: Any, env: Mapping[str, str], attr: str, var: str) -> Optional[tuple[str, Any]]:
    """(setting name, raw value) of the first place that sets it: server arg, then environment."""
    raw = getattr(server_args, attr, None) if server_args is not None else None
    if raw is not None:
        return f"server_args.{attr}", raw
    if str(env.get(var, "")).strip() != "":
        return var, env[var]
    return None


def load_perturb_settings(server_args: Any = None, environ: Optional[Mapping[str, str]] = None) -> PerturbSettings:
    """Per-kind ``SGLANG_KV_CANARY_PERTURB_<KIND>_PROB`` variables first; a ``kind=rate`` spec
    (``server_args.kv_canary_perturb``, else ``SGLANG_KV_CANARY_PERTURB``) then sets the kinds it names."""
    env = os.environ if environ is None else environ
    rates = {kind: parse_rate(rate_env(kind), env[rate_env(kind)]) for kind in KINDS
             if str(env.get(rate_env(kind), "")).strip() != ""}
    spec = _source(server_args, env, SPEC_ARG, SPEC_ENV)
    if spec is not None:
        rates.update(parse_spec(*spec))
    values: dict[str, Any] = {"rates": tuple((k, rates[k]) for k in KINDS if rates.get(k, 0.0) > 0.0)}
    for field_name, attr, var, parse in (
        ("seed", SEED_ARG, SEED_ENV, lambda n, v: int_at_least(n, v, 0)),
        ("warmup_steps", WARMUP_ARG, WARMUP_ENV, lambda n, v: int_at_least(n, v, 0)),
        ("target_group", GROUP_ARG, GROUP_ENV, _target_group),
        ("stop_file", STOP_ARG, STOP_ENV, lambda n, v: str(v).strip()),
    ):
        found = _source(server_args, env, attr, var)
        if found is not None:
            values[field_name] = parse(*found)
    return PerturbSettings(**values)
