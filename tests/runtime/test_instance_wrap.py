"""The canary's wrappers on an engine's instances (model.forward, model_runner.sample) make no reference cycle.

With a cycle, an engine outlives its last reference until the garbage collector runs; a collection that
frees its CUDA graphs while another engine captures invalidates that capture (seen in the benchmarks,
which build engines one after another in one process).
"""

import gc
import weakref

import pytest

from canary_instrument.runtime.setup import instance_wrap
from canary_instrument.runtime import mark_init_finished

from .mini_engine import MiniRunner, Scheduler, server_args


@pytest.fixture
def no_collector():
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if enabled:
        gc.enable()


def test_an_instrumented_runner_is_freed_with_its_last_reference(dev, no_collector):
    runner = MiniRunner(server_args(), device=dev)
    mark_init_finished(runner.canary_manager)
    sched = Scheduler(runner)
    req = sched.new_request([1, 2, 3])
    runner.forward_and_sample(sched.extend([req]), [4])  # a forward through the bracket, a sample through the wrap
    runner.forward_and_sample(sched.decode([req], [4]), [5])
    alive = [weakref.ref(o) for o in (runner, runner.model)]
    del runner, sched, req
    assert [ref() for ref in alive] == [None, None]  # and with them the engine's graphs (the manager holds none)


def test_the_wrapped_originals_are_still_reachable_bound_to_their_instance(dev):
    runner = MiniRunner(server_args(), device=dev)
    forward, sample = instance_wrap.original(runner.model.forward), instance_wrap.original(runner.sample)
    assert forward.__self__ is runner.model and forward.__func__ is type(runner.model).forward
    assert sample.__self__ is runner and sample.__func__ is MiniRunner.sample
    assert runner.model.forward.__name__ == "forward" and runner.sample.__doc__ == MiniRunner.sample.__doc__


def test_wrap_call_runs_the_method_then_the_note_and_keeps_a_signature_less_callable_working():
    """``wrap_call`` on a method (its signature kept for introspection) and on a builtin that has none."""
    import inspect

    from canary_instrument.runtime.setup.instance_wrap import wrap_call

    class Pool:
        def free(self, free_index, *, now=False):
            return ("freed", free_index, now)

    pool, seen = Pool(), []
    assert wrap_call(pool, "free", lambda args, kwargs, result: seen.append((args, kwargs)) or result, "__mark__")
    assert pool.free(3, now=True) == ("freed", 3, True) and seen == [((3,), {"now": True})]
    assert list(inspect.signature(pool.free).parameters) == ["free_index", "now"]

    class Holder:
        pass

    holder = Holder()
    holder.largest = max  # a builtin whose parameters inspect.signature cannot tell
    assert wrap_call(holder, "largest", lambda args, kwargs, result: result + 1, "__mark__")
    assert holder.largest([1, 2]) == 3
