"""The canary runtime that generated wiring calls: install, per-forward managers, kernel launch, reporting.

The wiring helpers are torch-free; everything that needs torch is imported on first use.
"""

from __future__ import annotations

from canary_instrument.runtime.lazy import lazy_attributes
from canary_instrument.runtime.setup.wiring import attach_radix_cache, canary_context, context_tuple, mark_init_finished

_LAZY = {
    "install_canary": "canary_instrument.runtime.setup.install",
    "CanaryManager": "canary_instrument.runtime.manager",
    "SingleForwardManager": "canary_instrument.runtime.step.single_forward",
    "CanaryStats": "canary_instrument.runtime.reports.stats",
    "CanarySettings": "canary_instrument.runtime.setup.settings",
    "load_settings": "canary_instrument.runtime.setup.settings",
    "Violation": "canary_instrument.runtime.reports.violations",
    "SwaDivergenceLog": "canary_instrument.runtime.reports.swa_divergence",
    "CanaryError": "canary_instrument.runtime.errors",
    "CanaryWiringError": "canary_instrument.runtime.errors",
    "CanaryHealthError": "canary_instrument.runtime.errors",
    "CanaryViolationError": "canary_instrument.runtime.errors",
}

__all__ = ["attach_radix_cache", "canary_context", "context_tuple", "mark_init_finished", *_LAZY]


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
