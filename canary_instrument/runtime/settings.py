"""Canary settings: read from the engine's server args, else the environment, validated once.

Server-arg attributes win over environment variables (an attribute that is absent or
None falls through to the environment, then to the default). Every bad value raises a
``ValueError`` that names the setting, so a typo never silently disables the canary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

MODES = ("none", "log", "raise")
REAL_KV_MODES = ("none", "partial", "all")
BACKENDS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class CanarySettings:
    """Every knob of the canary runtime (names in brackets: server arg / environment variable)."""

    mode: str = "none"  # [kv_canary / KV_CANARY] none | log | raise
    real_kv: str = "none"  # [kv_canary_real_kv / KV_CANARY_REAL_KV] none | partial | all
    token_check: bool = True  # [kv_canary_token_check / KV_CANARY_TOKEN_CHECK] expected-token table on/off
    stats_interval: int = 0  # [kv_canary_stats_interval / KV_CANARY_STATS_INTERVAL] steps between stats lines, 0 = off
    ring_size: int = 1024  # [kv_canary_ring_size / KV_CANARY_RING_SIZE] violation records kept on device
    # [kv_canary_swa_divergence_interval / KV_CANARY_SWA_DIVERGENCE_INTERVAL] steps between SWA lines, 0 = off
    swa_divergence_interval: int = 0
    # [kv_canary_backend / -] auto | triton | torch; ops.py's KV_CANARY_BACKEND variable overrides it.
    backend: str = "auto"
    dist_interval: int = 16  # [kv_canary_dist_interval / KV_CANARY_DIST_INTERVAL] steps between cross-rank checks
    token_window: int = 0  # [- / KV_CANARY_TOKEN_WINDOW] tokens re-sent per request per decode step, 0 = auto

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return text

    return parse


def _non_negative_int(name: str, value: Any) -> int:
    return _int_at_least(name, value, 0)


def _positive_int(name: str, value: Any) -> int:
    return _int_at_least(name, value, 1)


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return number


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be a boolean (1/0, true/false, on/off); got {value!r}")


# field -> (server-arg attribute or None, environment variable, parser)
_SOURCES: dict[str, tuple[Optional[str], Optional[str], Callable[[str, Any], Any]]] = {
    "mode": ("kv_canary", "KV_CANARY", _choice(MODES)),
    "real_kv": ("kv_canary_real_kv", "KV_CANARY_REAL_KV", _choice(REAL_KV_MODES)),
    "token_check": ("kv_canary_token_check", "KV_CANARY_TOKEN_CHECK", _flag),
    "stats_interval": ("kv_canary_stats_interval", "KV_CANARY_STATS_INTERVAL", _non_negative_int),
    "ring_size": ("kv_canary_ring_size", "KV_CANARY_RING_SIZE", _positive_int),
    "swa_divergence_interval": (
        "kv_canary_swa_divergence_interval",
        "KV_CANARY_SWA_DIVERGENCE_INTERVAL",
        _non_negative_int,
    ),
    "backend": ("kv_canary_backend", None, _choice(BACKENDS)),
    "dist_interval": ("kv_canary_dist_interval", "KV_CANARY_DIST_INTERVAL", _positive_int),
    "token_window": (None, "KV_CANARY_TOKEN_WINDOW", _non_negative_int),
}


def load_settings(server_args: Any = None, environ: Optional[Mapping[str, str]] = None) -> CanarySettings:
    """Build validated settings; the error names the server arg or variable that was wrong."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field_name, (attr, var, parse) in _SOURCES.items():
        raw = getattr(server_args, attr, None) if (attr and server_args is not None) else None
        if raw is not None:
            values[field_name] = parse(f"server_args.{attr}", raw)
        elif var is not None and str(env.get(var, "")).strip() != "":
            values[field_name] = parse(var, env[var])
    return CanarySettings(**values)
