"""The small functions generated wiring calls: they cost one ``is None`` check when the canary is off.

Nothing here imports torch, so the wiring can be imported (and the canary left off) for free.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, Optional


class context_tuple:  # noqa: N801 - named like the sglang helper it replaces
    """Enter several context managers left to right and leave them right to left."""

    __slots__ = ("_cms", "_stack")

    def __init__(self, *cms: ContextManager[Any]):
        self._cms = cms
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> tuple:
        if self._stack is not None:
            raise RuntimeError("context_tuple is not reentrant; build a new one per with-statement")
        stack = contextlib.ExitStack()
        with stack:
            values = tuple(stack.enter_context(cm) for cm in self._cms)
            self._stack = stack.pop_all()
        return values

    def __exit__(self, *exc_info) -> bool:
        stack, self._stack = self._stack, None
        return bool(stack.__exit__(*exc_info)) if stack is not None else False


def canary_context(
    manager: Any,
    forward_batch: Any = None,
    *,
    outside: Optional[Iterable[int]] = None,
    active: Optional[int] = None,
) -> ContextManager[Any]:
    """The context a wired site enters: a null context without a manager, else the manager's phases."""
    if manager is None:
        return contextlib.nullcontext()
    cms = []
    if outside is not None:
        cms.append(
            manager.with_ops_outside_graph(
                single_forward_indices=list(outside),
                maybe_inaccurate_forward_batch=forward_batch,
            )
        )
    if active is not None:
        cms.append(manager.with_active_single_forward_manager(active))
    if not cms:
        return contextlib.nullcontext()
    return cms[0] if len(cms) == 1 else context_tuple(*cms)


def mark_init_finished(manager: Any) -> None:
    """Tell the manager that warm-up and graph capture are over; a no-op without a manager."""
    if manager is not None:
        manager.mark_init_finished()


def attach_radix_cache(manager: Any, tree_cache: Any) -> None:
    """Hand the scheduler's prefix (radix) cache to the manager; a no-op without a manager."""
    if manager is not None:
        manager.attach_radix_cache(tree_cache)
