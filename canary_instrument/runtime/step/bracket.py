"""Bracket the model's outermost forward with the manager's inside-the-graph pre- and post-ops.

The model is called as sglang models are, ``forward(input_ids, positions, forward_batch, ...)``;
the forward batch (third argument or ``forward_batch=``) is what the pre-ops plan from. Only the
outermost call is bracketed: a model whose forward re-enters itself (as
vision-language models do around their language model) must not verify and write twice.

Each of the model's logits modules (sglang's ``LogitsProcessor``, whose forward every generating model calls
after its last layer: the class or a subclass) tells the manager when the logits begin, where a decode's post
pass may start beside them (``beside.py``): a forward pre-hook, which fires when the model calls the module.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from canary_instrument.runtime.setup.instance_wrap import remember, unbind

_MARK = "__kv_canary_bracketed__"
_LOGITS_HOOKS = "__kv_canary_logits_hooks__"  # on the model: the hooks' handles, for unbracket_model_forward
LOGITS_CLASS = "LogitsProcessor"  # sglang's logits module (srt/layers/logits_processor.py), subclasses included


def bracket_model_forward(model: Any, manager: Any) -> None:
    """Replace ``model.forward`` (on the instance) with the bracketed version."""
    original, owner = unbind(model, "forward")
    if original is None:
        raise ValueError(f"kv canary: model {type(model).__qualname__} has no callable forward to bracket")
    if getattr(original, _MARK, False):
        raise ValueError(f"kv canary: model {type(model).__qualname__}.forward is already bracketed by a canary")
    depth = threading.local()

    def call(args: tuple, kwargs: dict) -> Any:
        return original(*args, **kwargs) if owner is None else original(owner(), *args, **kwargs)

    def forward(*args: Any, **kwargs: Any) -> Any:
        level = getattr(depth, "value", 0)
        if level > 0:
            return call(args, kwargs)
        depth.value = 1
        try:
            batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
            input_ids = args[0] if args else kwargs.get("input_ids")
            if input_ids is None:
                input_ids = getattr(batch, "input_ids", None)
            manager.pre_ops_maybe_inside_graph(input_ids, batch)
            output = call(args, kwargs)
            manager.post_ops_maybe_inside_graph()
            return output
        finally:
            depth.value = 0

    # The original's name and doc, not its __wrapped__ (a bound method: a reference cycle, instance_wrap.py).
    functools.update_wrapper(forward, original, updated=())
    del forward.__wrapped__
    setattr(forward, _MARK, True)
    remember(forward, original, owner)
    model.forward = forward

    def at_logits(_module: Any, _args: tuple) -> None:
        manager.logits_ops_maybe_inside_graph()

    model.__dict__[_LOGITS_HOOKS] = [module.register_forward_pre_hook(at_logits) for module in logits_modules(model)]


def logits_modules(model: Any) -> list:
    """The model's submodules that compute its logits (an instance of a class named ``LOGITS_CLASS``, or of a
    subclass); none for a model that is not a torch module."""
    modules = getattr(model, "modules", None)
    if not callable(modules):
        return []
    return [m for m in modules() if any(cls.__name__ == LOGITS_CLASS for cls in type(m).__mro__)]


def unbracket_model_forward(model: Any) -> None:
    """Undo ``bracket_model_forward`` (tests, and engines that rebuild their model)."""
    forward = model.__dict__.get("forward")
    if forward is not None and getattr(forward, _MARK, False):
        del model.forward
    for handle in model.__dict__.pop(_LOGITS_HOOKS, ()):
        handle.remove()
