"""bench/sglang_server/turns.py: engines in separate processes work one at a time, in order, through a file."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "bench" / "sglang_server"
spec = importlib.util.spec_from_file_location("bench_sglang_server_turns", HERE / "turns.py")
turns = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = turns
spec.loader.exec_module(turns)

# One engine's process: N turns, each appending "index:k" to a shared log while it holds the turn; with FAIL_AT,
# it raises within that turn and stops the others (as serve.py's cost does when its engine raises).
WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {here!r})
    from turns import Turns
    path, log, spec, n, fail_at = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    t = Turns.parse(path, spec)
    t.stall_s = 20
    try:
        for k in range(n):
            with t.turn():
                with log.open("a") as f:
                    f.write(f"{{spec.split('/')[0]}}:{{k}} begin\\n")
                if k == fail_at:
                    raise RuntimeError("the engine failed")
                time.sleep(0.01)  # a rep: another engine working now would write inside it
                with log.open("a") as f:
                    f.write(f"{{spec.split('/')[0]}}:{{k}} end\\n")
    except RuntimeError as exc:
        t.stop()
        print(exc)
        sys.exit(1)
""").format(here=str(HERE))


def engines(tmp_path: Path, count: int, n: int, fail: dict[int, int] | None = None) -> tuple[list, list[str]]:
    path, log = tmp_path / "turns", tmp_path / "log"
    path.write_text("0")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # Started last first: the order of the work must come from the turns, not from who started first.
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(log), f"{i}/{count}", str(n),
                               str((fail or {}).get(i, -1))], stdout=subprocess.PIPE, text=True)
             for i in reversed(range(count))]
    results = [(p.wait(timeout=60), p.stdout.read()) for p in procs]
    return results, log.read_text().splitlines() if log.exists() else []


def test_each_engine_works_its_turn_alone_and_in_order(tmp_path):
    results, lines = engines(tmp_path, count=3, n=4)
    assert [code for code, _ in results] == [0, 0, 0]
    assert lines == [f"{i}:{k} {edge}" for k in range(4) for i in range(3) for edge in ("begin", "end")]


def test_an_engine_that_fails_stops_the_others_rather_than_leaving_them_waiting(tmp_path):
    results, lines = engines(tmp_path, count=3, n=4, fail={1: 2})
    assert [code for code, _ in results] == [1, 1, 1]
    # Engine 1 raised within its third turn: the turn never passed on, and no engine worked after it.
    assert lines[-3:] == ["0:2 begin", "0:2 end", "1:2 begin"]
    assert sum("another engine stopped" in out for _, out in results) == 2


def test_a_counter_that_never_moves_raises_after_the_stall(tmp_path):
    path = tmp_path / "turns"
    path.write_text("0")
    waiting = turns.Turns(path, index=1, count=2, stall_s=0.05)
    with pytest.raises(RuntimeError, match="stayed at 0"):
        with waiting.turn():
            pass


def test_without_a_file_every_turn_is_the_engine_s_own():
    alone = turns.Turns.parse(None, "0/1")
    for _ in range(3):
        with alone.turn():
            pass


def test_a_turn_outside_the_engines_is_refused():
    with pytest.raises(ValueError, match="engine 4 of 4"):
        turns.Turns.parse(None, "4/4")
