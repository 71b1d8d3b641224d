"""The torch-free wiring helpers that generated code calls."""

import contextlib

import pytest

from canary_instrument.runtime import canary_context, context_tuple, mark_init_finished


def _tracking(name, log):
    @contextlib.contextmanager
    def cm():
        log.append(f"enter {name}")
        try:
            yield name
        finally:
            log.append(f"exit {name}")

    return cm()


def test_context_tuple_enters_left_to_right_and_exits_in_reverse():
    log = []
    with context_tuple(_tracking("a", log), _tracking("b", log)) as values:
        log.append("body")
    assert values == ("a", "b")
    assert log == ["enter a", "enter b", "body", "exit b", "exit a"]


def test_context_tuple_unwinds_entered_managers_when_a_later_one_fails():
    log = []

    @contextlib.contextmanager
    def broken():
        raise RuntimeError("boom")
        yield

    with pytest.raises(RuntimeError, match="boom"):
        with context_tuple(_tracking("a", log), broken()):
            log.append("body")
    assert log == ["enter a", "exit a"]


def test_context_tuple_propagates_body_exceptions_through_every_manager():
    log = []
    with pytest.raises(KeyError):
        with context_tuple(_tracking("a", log), _tracking("b", log)):
            raise KeyError("x")
    assert log == ["enter a", "enter b", "exit b", "exit a"]


def test_canary_context_is_a_null_context_without_a_manager():
    cm = canary_context(None, object(), outside=[0], active=0)
    assert isinstance(cm, contextlib.nullcontext)
    mark_init_finished(None)  # no manager, nothing to do


class ManagerDouble:
    """Records which phases canary_context asks for (the real manager is tested elsewhere)."""

    def __init__(self):
        self.log = []

    def with_ops_outside_graph(self, single_forward_indices, maybe_inaccurate_forward_batch):
        return _tracking(f"outside {single_forward_indices} {maybe_inaccurate_forward_batch}", self.log)

    def with_active_single_forward_manager(self, index):
        return _tracking(f"active {index}", self.log)


def test_canary_context_orders_outside_before_active():
    manager = ManagerDouble()
    with canary_context(manager, "fb", outside=range(2), active=1):
        pass
    assert manager.log == ["enter outside [0, 1] fb", "enter active 1", "exit active 1", "exit outside [0, 1] fb"]


def test_canary_context_with_only_one_phase():
    manager = ManagerDouble()
    with canary_context(manager, active=3):
        pass
    with canary_context(manager, "fb", outside=[0]):
        pass
    assert manager.log == ["enter active 3", "exit active 3", "enter outside [0] fb", "exit outside [0] fb"]
