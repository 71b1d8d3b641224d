"""Run a command with a time limit, and when it is still running then, dump every Python stack of its
process group before killing it: how a hang is told apart from a slow exit, and where it hangs.

    python bench/sglang_server/watch.py LIMIT_S OUT_JSON -- COMMAND...

The command runs in a session of its own with PYTHONFAULTHANDLER=1, which every Python process it
starts inherits (the engine's scheduler and detokenizer too): on the limit the group gets SIGABRT, on
which each of them writes all its threads' stacks to its stderr (the run's log) and dies; a few seconds
later SIGKILL takes what is left. OUT_JSON records the exit code, the seconds the command ran and
whether it was killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: watch.py LIMIT_S OUT_JSON -- COMMAND...", file=sys.stderr)
        return 2
    limit, out, command = float(argv[0]), Path(argv[1]), argv[3:]
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    start = time.monotonic()
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=limit)
        killed = False
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, signal.SIGABRT)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    elapsed = time.monotonic() - start
    try:  # what the command left running in its group after it exited
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out.write_text(json.dumps({"command": command, "exit": code, "elapsed_s": round(elapsed, 1),
                               "killed_at_limit": killed, "limit_s": limit}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
