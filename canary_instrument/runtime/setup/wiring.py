"""The small functions generated wiring calls: they cost one ``is None`` check when the canary is off.

Nothing here imports torch, so the wiring can be imported (and the canary left off) for free.
"""

from __future__ import annotations

from typing import Any

# context_tuple (contexts.py), canary_context and the reusable sites it returns, which live with their cache
# (sites.py), are re-exported here.
from canary_instrument.runtime.setup.contexts import NULL_CONTEXT, context_tuple  # noqa: F401
from canary_instrument.runtime.setup.sites import SITE_CONTEXT_TYPES, canary_context  # noqa: F401


def mark_init_finished(manager: Any) -> None:
    """Tell the manager that warm-up and graph capture are over; a no-op without a manager."""
    if manager is not None:
        manager.mark_init_finished()


def attach_radix_cache(manager: Any, tree_cache: Any) -> None:
    """Hand the engine's prefix cache to the manager (once the scheduler has built it); a no-op without a manager."""
    if manager is not None:
        manager.attach_radix_cache(tree_cache)
