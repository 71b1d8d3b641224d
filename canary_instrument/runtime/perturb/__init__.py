"""Self-test perturbations: corruptions a user switches on to prove the canary catches them in their deployment.

Off by default; ``kv_canary_perturb`` / ``SGLANG_KV_CANARY_PERTURB*`` turn kinds on at a rate
each (``perturb_settings``). The ``Perturber`` runs them at the manager's hook points and logs every
injection as one ``kv_canary_perturb=`` line (``injection``); ``score`` matches those lines
against the ``kv_canary violation`` lines of the same run. The demo and the fault matrix use these
same kinds. The settings, the log line and the scorer import no torch.
"""

from __future__ import annotations

from canary_instrument.runtime.lazy import lazy_attributes
from canary_instrument.runtime.perturb.injection import Injection
from canary_instrument.runtime.perturb.perturb_settings import KINDS, PerturbSettings, load_perturb_settings
from canary_instrument.runtime.perturb.score import Score, score, score_log

_LAZY = {
    "Perturber": "canary_instrument.runtime.perturb.perturber",
    "ManagerView": "canary_instrument.runtime.perturb.perturber",
    "make_perturber": "canary_instrument.runtime.perturb.perturber",
}

__all__ = ["KINDS", "Injection", "PerturbSettings", "Score", "load_perturb_settings", "score", "score_log", *_LAZY]


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
