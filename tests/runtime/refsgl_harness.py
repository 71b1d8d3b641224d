"""The reference engine (golden/engine/refsgl) with its target model runner wired the way ``apply`` wires the
forward site, plus the three hook points the production features attach to in the manager:
before the model forward and after it (inside the step's outside-graph context) and at step end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from canary_instrument.demo.engine_copy import import_engine
from canary_instrument.runtime import canary_context, install_canary, mark_init_finished

ENGINE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "golden", "engine"))


def engine_class():
    # A plain import would reuse whatever `refsgl` this process imported last, e.g. a wired copy from an e2e
    # test, whose model runner installs a canary of its own; import the pristine one afresh.
    return import_engine(Path(ENGINE_ROOT)).Engine


@dataclass
class Hooks:
    before_forward: list[Callable[[Any], None]] = field(default_factory=list)
    after_forward: list[Callable[[Any], None]] = field(default_factory=list)
    step_end: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Harness:
    engine: Any
    manager: Any
    hooks: Hooks

    @property
    def tree_cache(self):
        return self.engine.scheduler.tree_cache


def instrumented(layout: str = "mha", init_finished: bool = True, device: str = "cpu", **engine_args) -> Harness:
    # Wired after the engine is built, so decode graphs captured at build time would lack the canary passes:
    # decode runs eagerly (the graph path of a wired engine is covered by the e2e suite).
    args = dict(attention_layout=layout, device=device, kv_canary="log", kv_canary_real_kv="partial",
                disable_cuda_graph=True)
    args.update(engine_args)
    engine = engine_class()(**args)
    runner = engine.model_runner
    runner.canary_manager = install_canary(server_args=engine.server_args, model_runner=runner)
    # Installed after the scheduler was built: hand the cache over as the scheduler does on a wired engine.
    if runner.canary_manager is not None:
        runner.canary_manager.attach_radix_cache(engine.scheduler.tree_cache)
    hooks = Hooks()
    original = runner.forward

    def forward(forward_batch, *a, **kw):  # the wired ModelRunner.forward site, with the hook points
        manager = None if runner.is_draft_worker else runner.canary_manager
        with canary_context(manager, forward_batch, outside=[0], active=0):
            for hook in hooks.before_forward:
                hook(forward_batch)
            out = original(forward_batch, *a, **kw)
            for hook in hooks.after_forward:
                hook(forward_batch)
        for hook in hooks.step_end:
            hook()
        return out

    runner.forward = forward
    if init_finished:
        mark_init_finished(runner.canary_manager)
    return Harness(engine, runner.canary_manager, hooks)
