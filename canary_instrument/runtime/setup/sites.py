"""Wired sites: the context a site enters, one reusable object per (listing, active), and their cache.

``canary_context`` is what generated wiring calls. For our manager it returns a ``Site`` that runs
``with_ops_outside_graph`` then ``with_active_single_forward_manager`` as the nested pair would, with
no objects made per step. Nothing here imports torch, so the wiring can be imported (and the canary
left off) for free.
"""

from __future__ import annotations

from typing import Any, ContextManager, Iterable, Optional

from canary_instrument.runtime.errors import CanaryWiringError
from canary_instrument.runtime.setup.contexts import NULL_CONTEXT, context_tuple
from canary_instrument.runtime.step.single_forward import SingleForwardManager, listed, sub_forward
from canary_instrument.runtime.step.steps import StepState

# Manager classes (ours registers itself) that keep reusable sites: ``manager.recent_sites`` maps ``active``
# to the site last made for it, whose ``listing``, ``index``, ``busy`` and ``batch`` say which call it
# serves; ``manager.site_context(forward_batch, outside, active)`` makes (or finds) one otherwise.
SITE_CONTEXT_TYPES: set = set()
_MAX_CACHED = 256


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
        # Reuse the site `active` had last when the listing is the same, without a call or a key.
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


def site_key(outside: Any, active: Any) -> Any:
    """The cache key of a site, or None where validation depends on more than the values (``1.0``
    and ``True`` equal ``1`` as keys but are not sub-forward indices alike): int indices only."""
    if active is not None and type(active) is not int:
        return None
    if outside is None or type(outside) is range:
        return (outside, active)
    if all(type(i) is int for i in outside):
        return (tuple(outside), active)
    return None


class SiteCache:
    """One manager's reusable sites: by (listing, active), and the one each ``active`` used last."""

    def __init__(self, manager: Any, steps: StepState, sfms: list):
        self._manager = manager
        self._steps = steps
        self._sfms = sfms  # the manager's sub-forward managers
        self._sites: dict = {}
        self.recent: dict = {}  # active (an int or None) -> the Site it used last (canary_context reads it)

    def get(self, forward_batch: Any, outside: Any, active: Optional[int]) -> Any:
        """The site for this call (made when none fits), holding ``forward_batch``."""
        if outside is None and active is None:
            return NULL_CONTEXT
        if outside is not None and type(outside) not in (list, tuple, range):
            outside = list(outside)  # an iterator: read it once
        key = site_key(outside, active)
        site = self._sites.get(key) if key is not None else None
        if site is None or site.busy:
            site = Site(self._manager, self._steps, self._sfms, outside, active)
            if key is not None and key not in self._sites and len(self._sites) < _MAX_CACHED:
                self._sites[key] = site
        if key is not None:
            self.recent[active] = site
        site.batch = forward_batch
        return site


class Site:
    """A wired site's context: ``with_ops_outside_graph`` then ``with_active_single_forward_manager``,
    entered and left as the nested pair would be: the entry calls the manager's
    ``pre_ops_outside_graph``, the exit its ``post_ops_outside_graph`` (which ends the step).
    """

    __slots__ = ("_manager", "_steps", "_all", "listing", "index", "_sfms", "_active_sfm", "_planned", "batch", "busy")

    def __init__(self, manager: Any, steps: StepState, sfms: list, outside: Any, active: Optional[int]):
        self._manager = manager
        self._steps = steps
        self._all = sfms
        self.listing = None if outside is None else (outside if type(outside) in (list, range) else list(outside))
        self.index = active
        self._sfms: Optional[list] = None  # the listing's sub-forward managers, resolved on first entry
        self._active_sfm: Optional[SingleForwardManager] = None  # likewise for ``active``
        self._planned = 0
        self.batch: Any = None
        self.busy = False

    def __enter__(self) -> Any:
        steps = self._steps
        side = steps.request_side
        if side is not None and side.pending and self.listing is not None:
            side.apply()  # before this forward, after every forward launched before the allocations and frees
        oracle = steps.token_oracle
        if oracle is not None and oracle.pending and self.listing is not None:
            oracle.apply()
        self.busy = True
        try:
            manager = self._manager
            if self.listing is not None:
                if steps.open is not None:
                    raise CanaryWiringError("kv canary: with_ops_outside_graph() nested inside another one")
                sfms = self._sfms
                if sfms is None:
                    sfms = self._sfms = listed(self._all, self.listing)
                if not steps.init_finished and steps.target is not None and steps.target.step:
                    # A draft whose worker never says its init is over: its target has served a step, so every
                    # graph is captured and this is serving (the target's step end normally got here first).
                    manager.follow_target()
                steps.open = self
                try:
                    self._planned = manager.pre_ops_outside_graph(sfms, self.batch) if steps.init_finished else 0
                except BaseException:
                    steps.open = None
                    raise
            if self.index is None:
                return None
            try:
                sfm = self._active_sfm
                if sfm is None:
                    sfm = self._active_sfm = sub_forward(self._all, self.index)
                if steps.active is not None:
                    raise CanaryWiringError(
                        f"kv canary: with_active_single_forward_manager({self.index}) nested inside "
                        f"with_active_single_forward_manager({steps.active.index})"
                    )
            except BaseException as err:
                if self.listing is not None:
                    self._leave_outside(type(err))
                raise
            steps.active = sfm
            return sfm
        except BaseException:
            self.busy = False
            self.batch = None
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        steps = self._steps
        try:
            if self.index is not None:
                steps.active = None
            if self.listing is not None:
                try:
                    self._manager.post_ops_outside_graph(self._sfms, self._planned, self.batch, exc_type is None)
                finally:
                    steps.open = None
        finally:
            self.busy = False
            self.batch = None
        return False

    def _leave_outside(self, exc_type: Any) -> None:
        try:
            self._manager.post_ops_outside_graph(self._sfms, self._planned, self.batch, exc_type is None)
        finally:
            self._steps.open = None
