"""The contexts a wired site enters when it has nothing, or several things, to enter: ``NULL_CONTEXT`` and
``context_tuple``. The layer below both ``sites`` and ``wiring``; nothing here imports torch.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

NULL_CONTEXT = contextlib.nullcontext()  # reusable and reentrant: a site without a manager enters nothing


@contextlib.contextmanager
def context_tuple(*cms: ContextManager[Any]):  # named like the sglang helper it replaces
    """Enter several context managers left to right and leave them right to left."""
    with contextlib.ExitStack() as stack:
        yield tuple(stack.enter_context(cm) for cm in cms)
