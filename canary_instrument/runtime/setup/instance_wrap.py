"""What a wrapper installed on one instance (``model.forward``, ``model_runner.sample``) calls, without a cycle.

A wrapper kept in an instance's ``__dict__`` that holds the instance's bound method makes a reference
cycle (instance -> wrapper -> bound method -> instance): the engine then outlives its last reference
until the garbage collector runs, and a collection that frees one engine's CUDA graphs while another
engine captures (sglang tests and benchmarks build engines in one process) invalidates that capture.
So the wrapper holds the method's function and a weak reference to the instance.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable, Optional

_FUNCTION = "__kv_canary_function__"
_OWNER = "__kv_canary_owner__"


def unbind(obj: Any, name: str) -> tuple[Optional[Callable], Optional[weakref.ReferenceType]]:
    """``(function, weak reference to obj)`` for a method bound to ``obj``; ``(callable, None)`` for any
    other callable attribute (call it as is); ``(None, None)`` when there is none."""
    original = getattr(obj, name, None)
    if original is None or not callable(original):
        return None, None
    function = getattr(original, "__func__", None)
    if function is not None and getattr(original, "__self__", None) is obj:
        return function, weakref.ref(obj)
    return original, None


def remember(wrapper: Callable, function: Callable, owner: Optional[weakref.ReferenceType]) -> None:
    """Note on ``wrapper`` what it replaced, for ``original``."""
    setattr(wrapper, _FUNCTION, function)
    setattr(wrapper, _OWNER, owner)


def original(wrapper: Callable) -> Callable:
    """The callable ``wrapper`` replaced, bound again to its instance (benchmarks and tests call it)."""
    function, owner = getattr(wrapper, _FUNCTION), getattr(wrapper, _OWNER)
    if owner is None:
        return function
    obj = owner()
    if obj is None:
        raise ReferenceError("kv canary: the instance this wrapper was installed on is gone")
    return function.__get__(obj, type(obj))


def wrap_call(obj: Any, name: str, after: Callable[[tuple, dict, Any], Any], mark: str, *,
              replace_own: bool = True) -> bool:
    """Replace ``obj.name`` on the instance by a call that runs it, then returns ``after(args, kwargs,
    result)``; False where ``obj`` has no such callable. ``mark`` names the wrapping canary part: a method
    it already wrapped (a canary installed again on the same engine) is unwrapped first with
    ``replace_own``, refused otherwise. The call keeps the method's name, docs and signature (not
    ``__wrapped__``: that would hold the instance, a reference cycle)."""
    function, owner = unbind(obj, name)
    if function is None:
        return False
    if getattr(function, mark, False):
        if not replace_own:
            raise ValueError(f"kv canary: {type(obj).__qualname__}.{name} is already wrapped ({mark})")
        obj.__dict__.pop(name, None)
        function, owner = unbind(obj, name)
    try:
        signature = inspect.signature(getattr(obj, name))
    except (TypeError, ValueError):  # a callable that tells none (a builtin, say): the call's own
        signature = None

    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs) if owner is None else function(owner(), *args, **kwargs)
        return after(args, kwargs, result)

    functools.update_wrapper(call, function, updated=())
    call.__dict__.pop("__wrapped__", None)
    if signature is not None:
        call.__signature__ = signature
    setattr(call, mark, True)
    remember(call, function, owner)
    setattr(obj, name, call)
    return True
