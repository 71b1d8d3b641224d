"""Canary settings: read from the engine's server args, else the environment, validated once.

Each setting has server-arg attributes and environment variables, sglang's names first
(``kv_canary_real_data``, ``SGLANG_KV_CANARY_*``) and the runtime's older names as aliases.
Server-arg attributes win over environment variables (an attribute that is absent or None
falls through to the next source, then to the default). Every bad value raises a
``ValueError`` that names the attribute or variable, so a typo never silently disables the canary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from canary_instrument.runtime.perturb.perturb_settings import PerturbSettings, int_at_least, load_perturb_settings

MODES = ("none", "log", "raise")
DEFAULT_LINES_PER_STEP = 8
DEFAULT_LINES_PER_INTERVAL = 32
ALL_LINES = 1 << 62  # no bound
LOG_FORMATS = ("canary", "sglang")
REAL_KV_MODES = ("none", "partial", "all")
BACKENDS = ("auto", "triton", "torch")
# Where timing jitter may wait (runtime/features/jitter.py): before/after the pre-forward pass, before/after each
# layer's KV write (the pool's set_kv_buffer, where attention starts), before/after the post-forward pass.
JITTER_POINTS = ("pre_before", "pre_after", "attn_before", "attn_after", "post_before", "post_after")
# A longer wait per point is a unit mistake (nanoseconds given as microseconds) and would look like a hang.
JITTER_MAX_US_LIMIT = 10_000_000


@dataclass(frozen=True)
class CanarySettings:
    """Every knob of the canary runtime (names in brackets: server arg / environment variable)."""

    mode: str = "none"  # [kv_canary / KV_CANARY] none | log | raise
    # [kv_canary_real_data, kv_canary_real_kv / KV_CANARY_REAL_KV] none | partial | all
    real_kv: str = "none"
    # [kv_canary_token_check / SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT, KV_CANARY_TOKEN_CHECK] expected tokens
    token_check: bool = True
    # [kv_canary_stats_interval / SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS, KV_CANARY_STATS_INTERVAL] 0 = off
    stats_interval: int = 0
    # [kv_canary_ring_size / SGLANG_KV_CANARY_RING_CAPACITY, KV_CANARY_RING_SIZE] violation records kept on device
    ring_size: int = 1024
    # [kv_canary_swa_divergence_interval / SGLANG_KV_CANARY_SWA_DIVERGENCE_STATS_INTERVAL,
    #  KV_CANARY_SWA_DIVERGENCE_INTERVAL] steps between SWA lines, 0 = off
    swa_divergence_interval: int = 0
    # [kv_canary_backend / -] auto | triton | torch; ops.py's KV_CANARY_BACKEND variable overrides it.
    backend: str = "auto"
    dist_interval: int = 16  # [kv_canary_dist_interval / KV_CANARY_DIST_INTERVAL] steps between cross-rank checks
    # [kv_canary_readback_interval / KV_CANARY_READBACK_INTERVAL] steps between tagged status snapshots
    # (one async copy and an event each): the health check, and stats/SWA figures between their own
    # lines, come back within this many steps. Violations do not wait for it (status.py). 64: a step that
    # takes or reads a snapshot costs many times a clean step's host time (a per-site probe's table in
    # git show c2b030b:bench/runtime/RESULTS.md), and a draft manager counts two steps per EAGLE step;
    # a lost bracket still raises within a second or so.
    readback_interval: int = 64
    # [kv_canary_sweep_interval / KV_CANARY_SWEEP_INTERVAL] steps between idle-cache sweep slices, 0 = off
    sweep_interval: int = 0
    sweep_slots: int = 4096  # [kv_canary_sweep_slots / KV_CANARY_SWEEP_SLOTS] cached slots verified per sweep slice
    # [kv_canary_jitter_max_us / SGLANG_KV_CANARY_JITTER_MAX_US] longest spin wait per jitter point, 0 = off
    jitter_max_us: int = 0
    jitter_seed: int = 0  # [kv_canary_jitter_seed / SGLANG_KV_CANARY_JITTER_SEED] same seed, same wait sequence
    # [kv_canary_jitter_points / SGLANG_KV_CANARY_JITTER_POINTS] comma list of JITTER_POINTS, or "all"
    jitter_points: tuple = JITTER_POINTS
    # [sampling_backend == "token_oracle" (upstream's --sampling-backend), kv_canary_token_oracle /
    #  SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE] the token oracle (token_oracle.py): sampler override + input check
    token_oracle: bool = False
    # [kv_canary_token_oracle_check / SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT] the oracle's write-time input check
    token_oracle_check: bool = True
    # [kv_canary_token_oracle_seed / SGLANG_KV_CANARY_TOKEN_ORACLE_SEED] 0 = upstream's tokens exactly
    token_oracle_seed: int = 0
    # Reporting under a flood (reports/reporting.py). [kv_canary_log_lines_per_step / KV_CANARY_LOG_LINES_PER_STEP]
    # violations logged in full per step (the first of each new reasons/kernel/group class always is); unset:
    # DEFAULT_LINES_PER_STEP, or every violation while self-test perturbations are armed (their score reads
    # each injection's lines back from the log)
    log_lines_per_step: Optional[int] = None
    # [kv_canary_log_lines_per_interval / KV_CANARY_LOG_LINES_PER_INTERVAL] the same bound per summary interval,
    # so a bug that fires at every step logs a few lines an interval, not lines_per_step at every step
    log_lines_per_interval: Optional[int] = None
    # [kv_canary_summary_interval / KV_CANARY_SUMMARY_INTERVAL] steps between summaries of what was withheld
    summary_interval: int = 100
    # [kv_canary_violation_sink / KV_CANARY_VIOLATION_SINK] a file to append every violation to as JSON, "" = off
    violation_sink: str = ""
    # [kv_canary_log_format / KV_CANARY_LOG_FORMAT] canary | sglang (the line sglang's own test helpers parse)
    log_format: str = "canary"
    # [kv_canary_perturb*, SGLANG_KV_CANARY_PERTURB* (perturb_settings.py)] self-test perturbations, off by default
    perturb: PerturbSettings = field(default_factory=PerturbSettings)

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def lines_per_step(self) -> int:
        """The log's bound on full violation lines per step, as set or as its default says."""
        if self.log_lines_per_step is not None:
            return self.log_lines_per_step
        return ALL_LINES if self.perturb.enabled else DEFAULT_LINES_PER_STEP

    @property
    def lines_per_interval(self) -> int:
        """The log's bound on full violation lines per summary interval, as set or as its default says."""
        if self.log_lines_per_interval is not None:
            return self.log_lines_per_interval
        return ALL_LINES if self.perturb.enabled else DEFAULT_LINES_PER_INTERVAL


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return text

    return parse


def _non_negative_int(name: str, value: Any) -> int:
    return int_at_least(name, value, 0)


def _positive_int(name: str, value: Any) -> int:
    return int_at_least(name, value, 1)


def _jitter_max_us(name: str, value: Any) -> int:
    number = _non_negative_int(name, value)
    if number > JITTER_MAX_US_LIMIT:
        raise ValueError(f"{name} must be at most {JITTER_MAX_US_LIMIT} microseconds; got {value!r}")
    return number


def _seed(name: str, value: Any) -> int:
    number = _non_negative_int(name, value)
    if number >= 1 << 63:
        raise ValueError(f"{name} must be below 2**63; got {value!r}")
    return number


def _jitter_points(name: str, value: Any) -> tuple:
    names = [part.strip().lower() for part in str(value).split(",") if part.strip()]
    if names == ["all"]:
        return JITTER_POINTS
    unknown = [n for n in names if n not in JITTER_POINTS]
    if unknown or not names:
        raise ValueError(f"{name} must be 'all' or a comma list of {', '.join(JITTER_POINTS)}; got {value!r}")
    return tuple(p for p in JITTER_POINTS if p in names)


def _oracle_backend(name: str, value: Any) -> bool:
    """sglang's ``sampling_backend`` asks for the oracle by name; the other sources are flags."""
    if name == "server_args.sampling_backend":
        return str(value).strip().lower() == "token_oracle"
    return _flag(name, value)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be a boolean (1/0, true/false, on/off); got {value!r}")


# field -> (server-arg attributes, environment variables, parser); each list in precedence order.
# sglang's own names come first where it has one (its ServerArgs fields, its SGLANG_KV_CANARY_*
# variables in srt/environ.py); the runtime's earlier names stay as aliases.
_SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...], Callable[[str, Any], Any]]] = {
    "mode": (("kv_canary",), ("KV_CANARY",), _choice(MODES)),
    "real_kv": (("kv_canary_real_data", "kv_canary_real_kv"), ("KV_CANARY_REAL_KV",), _choice(REAL_KV_MODES)),
    "token_check": (
        ("kv_canary_token_check",),
        ("SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT", "KV_CANARY_TOKEN_CHECK"),
        _flag,
    ),
    "stats_interval": (
        ("kv_canary_stats_interval",),
        ("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "KV_CANARY_STATS_INTERVAL"),
        _non_negative_int,
    ),
    "ring_size": (("kv_canary_ring_size",), ("SGLANG_KV_CANARY_RING_CAPACITY", "KV_CANARY_RING_SIZE"), _positive_int),
    "swa_divergence_interval": (
        ("kv_canary_swa_divergence_interval",),
        ("SGLANG_KV_CANARY_SWA_DIVERGENCE_STATS_INTERVAL", "KV_CANARY_SWA_DIVERGENCE_INTERVAL"),
        _non_negative_int,
    ),
    "backend": (("kv_canary_backend",), (), _choice(BACKENDS)),
    "dist_interval": (("kv_canary_dist_interval",), ("KV_CANARY_DIST_INTERVAL",), _positive_int),
    "readback_interval": (("kv_canary_readback_interval",), ("KV_CANARY_READBACK_INTERVAL",), _positive_int),
    "sweep_interval": (("kv_canary_sweep_interval",), ("KV_CANARY_SWEEP_INTERVAL",), _non_negative_int),
    "sweep_slots": (("kv_canary_sweep_slots",), ("KV_CANARY_SWEEP_SLOTS",), _positive_int),
    "jitter_max_us": (("kv_canary_jitter_max_us",), ("SGLANG_KV_CANARY_JITTER_MAX_US",), _jitter_max_us),
    "jitter_seed": (("kv_canary_jitter_seed",), ("SGLANG_KV_CANARY_JITTER_SEED",), _seed),
    "jitter_points": (("kv_canary_jitter_points",), ("SGLANG_KV_CANARY_JITTER_POINTS",), _jitter_points),
    # A server arg that names another sampling backend turns the oracle off whatever the variable says,
    # as upstream (the variable only lets sglang accept --sampling-backend token_oracle).
    "token_oracle": (
        ("sampling_backend", "kv_canary_token_oracle"), ("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE",), _oracle_backend,
    ),
    "token_oracle_check": (
        ("kv_canary_token_oracle_check",), ("SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT",), _flag,
    ),
    "token_oracle_seed": (
        ("kv_canary_token_oracle_seed",), ("SGLANG_KV_CANARY_TOKEN_ORACLE_SEED",), _non_negative_int,
    ),
    "log_lines_per_step": (("kv_canary_log_lines_per_step",), ("KV_CANARY_LOG_LINES_PER_STEP",), _non_negative_int),
    "log_lines_per_interval": (
        ("kv_canary_log_lines_per_interval",), ("KV_CANARY_LOG_LINES_PER_INTERVAL",), _non_negative_int,
    ),
    "summary_interval": (("kv_canary_summary_interval",), ("KV_CANARY_SUMMARY_INTERVAL",), _positive_int),
    "violation_sink": (("kv_canary_violation_sink",), ("KV_CANARY_VIOLATION_SINK",), lambda name, value: str(value)),
    "log_format": (("kv_canary_log_format",), ("KV_CANARY_LOG_FORMAT",), _choice(LOG_FORMATS)),
}

def load_settings(server_args: Any = None, environ: Optional[Mapping[str, str]] = None) -> CanarySettings:
    """Build validated settings; the error names the server arg or variable that was wrong."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field_name, (attrs, variables, parse) in _SOURCES.items():
        source = _first_set(server_args, attrs, env, variables)
        if source is not None:
            name, raw = source
            values[field_name] = parse(name, raw)
    values["perturb"] = load_perturb_settings(server_args, env)
    return CanarySettings(**values)


def _first_set(server_args: Any, attrs: tuple, env: Mapping[str, str], variables: tuple) -> Optional[tuple[str, Any]]:
    if server_args is not None:
        for attr in attrs:
            raw = getattr(server_args, attr, None)
            if raw is not None:
                return f"server_args.{attr}", raw
    for var in variables:
        if str(env.get(var, "")).strip() != "":
            return var, env[var]
    return None


def unsupported_upstream(settings: CanarySettings, environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The sglang canary knobs that are set but have no effect here, each with why (named in one warning at
    install, so nobody believes a check is running when it is not)."""
    env = os.environ if environ is None else environ
    found = []
    if not settings.token_oracle and _flag_set(env.get("SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT", "")):
        found.append(f"SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT={env['SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT']} "
                     "(the oracle's input check needs the token oracle: --sampling-backend token_oracle)")
    return found


def _flag_set(value: Any) -> bool:
    return str(value).strip().lower() not in ("", "0", "0.0", "false", "no", "off")


def warn_unsupported_upstream(server_args: Any, environ: Optional[Mapping[str, str]] = None) -> None:
    """Log one WARNING naming the sglang canary knobs that are set but do nothing in this runtime."""
    import logging

    found = unsupported_upstream(load_settings(server_args, environ), environ)
    if found:
        logging.getLogger("canary_instrument.runtime").warning(
            "kv canary: set but not supported by canary_instrument.runtime, ignored: %s", "; ".join(found)
        )
