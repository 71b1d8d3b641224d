"""The gate on refactored trees (issue 35): `scaffold`, `apply`, then `check` on every refactor of a release,
as a team adopting the tool on its own fork would run them.

    CANARY_INSTRUMENT_SGLANG_CACHE=/work/sglang_cache python tests/realtree/refactor_gate.py 0.5.17 -j 2

prints one markdown row per (release, refactor): the three exit codes and check's findings by code. A
refactor that adds no forward path must end with check exiting 0 and no finding; the `fork-*` refactors add
unbracketed forwards, which must stay loud (CI301).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `realtree` as the package pytest imports

from realtree.conftest import RELEASES, sglang_srt  # noqa: E402
from realtree.refactors import REFACTORS, RefactorError, make_refactored  # noqa: E402

UNREFACTORED = "unrefactored"
FINDING = re.compile(r":\d+:\d+: (CI\d+) ")


def row(task: tuple[str, str]) -> str:
    version, refactor = task
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "sglang" / "srt"
        try:
            if refactor == UNREFACTORED:
                shutil.copytree(sglang_srt(version), dest)
            else:
                make_refactored(sglang_srt(version), dest, refactor)
        except RefactorError as error:
            return f"| {version} | {refactor} | n/a: {error} ||||"
        codes = []
        for command in (["scaffold", "-q"], ["apply", "-q"], ["check", "--no-cache"]):
            done = subprocess.run([sys.executable, "-m", "canary_instrument", *command, str(dest)],
                                  capture_output=True, text=True, check=False)
            codes.append(done.returncode)
        found = Counter(FINDING.findall(done.stdout))
    findings = ", ".join(f"{code}×{n}" for code, n in sorted(found.items())) or "none"
    return f"| {version} | {refactor} | {codes[0]} | {codes[1]} | {codes[2]} | {findings} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=RELEASES)
    parser.add_argument("--refactor", choices=[UNREFACTORED, *REFACTORS], action="append", help="default: all")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args()
    tasks = [(v, r) for v in args.versions for r in (args.refactor or [UNREFACTORED, *REFACTORS])]
    print("| release | refactor | `scaffold` exit | `apply` exit | `check` exit | check's findings |\n|---|---|---|---|---|---|")
    with ProcessPoolExecutor(args.jobs) as pool:
        for line in pool.map(row, tasks):
            print(line, flush=True)


if __name__ == "__main__":
    main()
