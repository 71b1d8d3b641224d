"""The small functions generated wiring calls: they cost one ``is None`` check when the canary is off.

Nothing here imports torch, so the wiring can be imported (and the canary left off) for free.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, Optional

NULL_CONTEXT = contextlib.nullcontext()  # reusable and reentrant: a site without a manager enters nothing
# Manager classes (ours registers itself) that keep reusable site contexts: ``manager.recent_sites`` maps
# ``active`` to the context last made for it, whose ``listing``, ``index``, ``busy`` and ``batch`` say which
# call it serves; ``manager.site_context(forward_batch, outside, active)`` makes (or finds) one otherwise.
SITE_CONTEXT_TYPES: set = set()


class context_tuple:  # noqa: N801 - named like the sglang helper it replaces
    """Enter several context managers left to right and leave them right to left.

    Written out instead of using ``contextlib.ExitStack``: it runs at every wired site on every
    step, and the stack's bookkeeping costs several times the host time of these few lines.
    """

    __slots__ = ("_cms", "_entered")

    def __init__(self, *cms: ContextManager[Any]):
        self._cms = cms
        self._entered: Optional[list] = None

    def __enter__(self) -> tuple:
        if self._entered is not None:
            raise RuntimeError("context_tuple is not reentrant; build a new one per with-statement")
        values, entered = [], []
        try:
            for cm in self._cms:
                values.append(cm.__enter__())
                entered.append(cm)
        except BaseException as err:
            # Leave what was entered, with the failure as the exception in flight; it still propagates.
            _leave(entered, type(err), err, err.__traceback__)
            raise
        self._entered = entered
        return tuple(values)

    def __exit__(self, exc_type, exc, tb) -> bool:
        entered, self._entered = self._entered, None
        return _leave(entered or [], exc_type, exc, tb)


def _leave(entered: list, exc_type, exc, tb) -> bool:
    """Exit ``entered`` in reverse as nested with-statements would; True if the exception was suppressed."""
    suppressed = False
    raised = None
    for cm in reversed(entered):
        try:
            if cm.__exit__(exc_type, exc, tb):
                suppressed, raised = True, None
                exc_type = exc = tb = None
        except BaseException as err:  # an exit that raises replaces the exception in flight
            if exc is not None and err is not exc and err.__context__ is None:
                err.__context__ = exc
            suppressed, raised = False, err
            exc_type, exc, tb = type(err), err, err.__traceback__
    if raised is not None:
        raise raised
    return suppressed


def canary_context(
    manager: Any,
    forward_batch: Any = None,
    *,
    outside: Optional[Iterable[int]] = None,
    active: Optional[int] = None,
) -> ContextManager[Any]:
    """The context a wired site enters: a null context without a manager, else the manager's phases
    (``with_ops_outside_graph`` for ``outside``, then ``with_active_single_forward_manager(active)``).
    A manager that offers ``site_context`` (ours) gives both in one reusable object; another engine's
    manager gets the pair of its own contexts."""
    if manager is None:
        return NULL_CONTEXT
    if type(manager) in SITE_CONTEXT_TYPES:
        # Reuse the site `active` had last when the listing is the same, without a call or a key: a wired
        # site runs once per step with the host's caches cold, where each call costs microseconds.
        # Exact ints only: 1.0 equals 1 but is no sub-forward index, so site_context validates it.
        try:
            site = manager.recent_sites.get(active)
        except TypeError:  # an unhashable `active`: site_context reports it
            site = None
        if site is not None and site.index is active and not site.busy:
            listing = site.listing
            if listing is outside or (type(outside) is list and listing == outside):
                for i in outside or ():
                    if type(i) is not int:
                        break
                else:
                    site.batch = forward_batch
                    return site
        return manager.site_context(forward_batch, outside, active)
    site_context = getattr(manager, "site_context", None)
    if site_context is not None:
        return site_context(forward_batch, outside, active)
    cms = []
    if outside is not None:
        cms.append(
            manager.with_ops_outside_graph(
                single_forward_indices=outside if type(outside) is list else list(outside),
                maybe_inaccurate_forward_batch=forward_batch,
            )
        )
    if active is not None:
        cms.append(manager.with_active_single_forward_manager(active))
    if not cms:
        return NULL_CONTEXT
    return cms[0] if len(cms) == 1 else context_tuple(*cms)


def mark_init_finished(manager: Any) -> None:
    """Tell the manager that warm-up and graph capture are over; a no-op without a manager."""
    if manager is not None:
        manager.mark_init_finished()


def attach_radix_cache(manager: Any, tree_cache: Any) -> None:
    """Hand the engine's prefix cache to the manager (once the scheduler has built it); a no-op without a manager."""
    if manager is not None:
        manager.attach_radix_cache(tree_cache)
