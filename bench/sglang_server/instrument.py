"""Instrument a copy of a released sglang package as a user does: `scaffold`, `apply`, then the gate.

    python bench/sglang_server/instrument.py SRC_PACKAGE DEST_PACKAGE

SRC_PACKAGE is an installed `sglang` folder (its `srt` is what the tool rewrites). The copy is made
beside DEST_PACKAGE and renamed into place only once `scaffold` and `apply` ran and `apply --check` and
`check` both exit 0 with no finding, so a failed run leaves no half-instrumented package behind. The
tool's output goes to stdout. Exit 0 done (or DEST_PACKAGE already there), 1 a step exited non-zero.
gpu.sh runs it on the GPU machine; tests/bench/test_sglang_server.py runs it on the CPU on the same
release, so a break of this step shows in CI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

STEPS = (
    ("scaffold", []),
    ("apply", []),
    ("apply", ["--check"]),  # the gate: nothing left to wire
    ("check", ["--no-cache"]),  # the gate: no finding
)


def run_tool(command: str, options: list[str], srt: Path) -> int:
    proc = subprocess.run([sys.executable, "-m", "canary_instrument", command, *options, str(srt)],
                          capture_output=True, text=True)
    print(f"$ canary-instrument {' '.join([command, *options])} {srt}  -> exit {proc.returncode}", flush=True)
    sys.stdout.write(proc.stdout + proc.stderr)
    return proc.returncode


def instrument(source: Path, dest: Path) -> int:
    if dest.exists():
        print(f"{dest} is there already: nothing to do")
        return 0
    staging = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(staging.parent / staging.name, ignore_errors=True)
    staging.mkdir(parents=True)
    package = staging / source.name
    shutil.copytree(source, package, symlinks=True)
    for command, options in STEPS:
        code = run_tool(command, options, package / "srt")
        if code != 0:
            print(f"instrument: `{' '.join([command, *options])}` exited {code}: the gate is not green", file=sys.stderr)
            return 1
    package.rename(dest)
    staging.rmdir()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python bench/sglang_server/instrument.py SRC_PACKAGE DEST_PACKAGE", file=sys.stderr)
        return 2
    return instrument(Path(argv[0]).resolve(), Path(argv[1]).resolve())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
