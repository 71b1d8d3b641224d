"""The two-process pair check shares a tree with: same results as one process, each side keeps what it
computed for the next step, and a child that fails or cannot be forked leaves the work to this process.

The forking cases run in a fresh interpreter: a pytest-xdist worker runs threads, where the pair
(rightly) does not fork.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from canary_instrument.rewrite.io.parallel import MIN_WEIGHT, Pair

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) < 2,
    reason="a pair forks only with two cores to run on",
)

_SCENARIO = textwrap.dedent("""
    import json, os, sys, time
    from canary_instrument.rewrite.io.parallel import MIN_WEIGHT, Pair, map_two

    seen = {}  # what each process has computed: stays in the process that computed it

    def square(item):
        if mode == "fail-first" and os.getpid() != parent:
            raise RuntimeError("the child fails in the first map")
        time.sleep(0.02)  # long enough that both sides take items from the queue
        if mode == "nested":  # a step that maps on its own (check's caller search does)
            assert map_two(abs, [-1, -2], [MIN_WEIGHT, MIN_WEIGHT]) == [1, 2]
        seen[item] = os.getpid()
        return item * item

    def held(items):
        # The items this process computed itself, among `items` (same answer wherever it runs,
        # but only the side that computed an item knows it without recomputing).
        return sorted(i for i in items if seen.get(i) == os.getpid())

    def fail(_):
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        return "here"

    parent = os.getpid()
    mode = sys.argv[1]
    out = {}
    with Pair({"square": square, "held": held, "fail": fail}, MIN_WEIGHT) as pair:
        results, sides = pair.map("square", list(range(10)), [1] * 10)
        out["forked"] = pair.forked
        out["results"], out["sides"] = results, sides
        out["second"] = pair.map("square", [10, 11, 12, 13], [1, 1, 1, 1])
        mine = [i for i, s in zip(range(10), sides) if s == 0]
        theirs = [i for i, s in zip(range(10), sides) if s == 1]
        out["held"] = pair.both("held", (list(range(10)),), (list(range(10)),))
        out["expected_held"] = [mine, theirs]
        if mode == "fail":
            out["fail"] = pair.both("fail", (0,), (1,))
            out["forked_after_failure"] = pair.forked
            out["after"] = pair.map("square", [3, 4], [1, 1])
        child = pair.pid
    out["reaped"] = True
    if child is not None:
        try:
            os.waitpid(child, os.WNOHANG)
            out["reaped"] = False
        except ChildProcessError:
            pass
    print(json.dumps(out))
""")


def _run(mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _SCENARIO, mode], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    return json.loads(proc.stdout)


@two_cores
def test_a_pair_shares_a_map_and_each_side_keeps_what_it_computed():
    out = _run("ok")
    assert out["forked"]
    assert out["results"] == [i * i for i in range(10)]
    assert 0 in out["sides"] and 1 in out["sides"]  # both sides took items from the queue
    assert out["held"] == out["expected_held"]  # the child answered from its own memory
    assert out["second"][0] == [100, 121, 144, 169]
    assert sorted(out["second"][1]) == [0, 0, 1, 1]  # a later map: split by weight, half each
    assert out["reaped"]


@two_cores
def test_a_map_inside_a_step_leaves_the_worker_its_pair():
    out = _run("nested")
    assert out["results"] == [i * i for i in range(10)]
    assert 1 in out["sides"]
    assert out["held"] == out["expected_held"]  # later steps still ran in the worker, over its memory
    assert sorted(out["second"][1]) == [0, 0, 1, 1]
    assert out["reaped"]


@two_cores
def test_a_child_failing_its_first_share_leaves_it_to_this_process():
    out = _run("fail-first")
    assert out["results"] == [i * i for i in range(10)]
    assert out["sides"] == [0] * 10
    assert not out["forked"]
    assert out["reaped"]


@two_cores
def test_a_failing_child_leaves_its_share_to_this_process():
    out = _run("fail")
    assert out["fail"] == ["here", "here"]
    assert not out["forked_after_failure"]
    assert out["after"] == [[9, 16], [0, 0]]  # no child any more: all computed here
    assert out["reaped"]


def test_small_work_is_not_forked():
    calls = []
    with Pair({"f": lambda x: calls.append(x) or x + 1}, MIN_WEIGHT - 1) as pair:
        assert not pair.forked
        assert pair.map("f", [1, 2, 3], [1, 1, 1]) == ([2, 3, 4], [0, 0, 0])
        assert pair.both("f", (10,), (20,)) == (11, 21)
    assert calls == [1, 2, 3, 10, 20]
