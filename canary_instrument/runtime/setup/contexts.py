"""The contexts a wired site enters when it has nothing, or several things, to enter: ``NULL_CONTEXT`` and
``context_tuple``. The layer below both ``sites`` and ``wiring``; nothing here imports torch.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

NULL_CONTEXT = contextlib.nullcontext()  # reusable and reentrant: a site without a manager enters nothing


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
