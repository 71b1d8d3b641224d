"""The refactored-tree table of issue 20: `apply` on every refactor of released sglang trees, measured.

    CANARY_INSTRUMENT_SGLANG_CACHE=/work/sglang_cache python tests/realtree/refactor_report.py 0.5.20 -j 2

prints one markdown row per (release, state, refactor): sites wired / expected, hooks placed / expected,
apply's exit code and findings by code, generated reads of what does not exist, the files a second
`apply` would change, whether the property holds and, where it does not, what went missing. The numbers
come from the same `measure()` test_refactors.py asserts on; `--json FILE` writes every detail.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `realtree` as the package pytest imports

from realtree.conftest import RELEASES  # noqa: E402
from realtree.refactors import REFACTORS, RefactorError  # noqa: E402
from realtree.test_refactors import STATES, UNREFACTORED, measure, violation  # noqa: E402

HEADER = (
    "| release | state | refactor | sites wired / expected | hooks placed / expected | `apply` exit | findings "
    "| dangling reads | 2nd `apply` changes | property | what goes missing |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(task: tuple[str, str, str]) -> tuple[str, dict]:
    version, state, refactor = task
    try:
        m = measure(version, state, refactor)
    except RefactorError as error:
        return f"| {version} | {state} | {refactor} | n/a: {error} |||||||", {"task": task, "skipped": str(error)}
    extra = f" (+{len(m.hooks_extra)} elsewhere)" if m.hooks_extra else ""
    extra_sites = f" (+{m.sites_extra} elsewhere)" if m.sites_extra else ""
    verdict = "holds" if m.holds else "**violated**"
    known = violation(version, state, refactor)
    if known and m.holds:
        verdict += " (xfail entry stale)"
    elif not known and not m.holds:
        verdict += " (no xfail entry)"
    codes = m.finding_codes() + (f", {len(m.errors)} errors" if m.errors else "")
    missing = "; ".join(m.missing + m.dangling + [f"unreported forward {u}" for u in m.unreported])
    line = (f"| {version} | {state} | {refactor} | {m.sites} / {m.sites_expected}{extra_sites} "
            f"| {m.hooks} / {m.hooks_expected}{extra} | {m.exit_code} | {codes} | {len(m.dangling)} | {m.again} "
            f"| {verdict} | {missing} |")
    details = {"task": task, "note": m.note, "summary": m.summary(), "holds": m.holds}
    return line, details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=RELEASES)
    parser.add_argument("--state", choices=STATES, action="append", help="default: both")
    parser.add_argument("--refactor", choices=[UNREFACTORED, *REFACTORS], action="append", help="default: all")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tasks = [(v, s, r) for v in args.versions for s in args.state or STATES
             for r in args.refactor or [UNREFACTORED, *REFACTORS]]
    print(HEADER, flush=True)
    details = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for line, detail in pool.map(row, tasks):  # in task order
            print(line, flush=True)
            details.append(detail)
            if args.json:
                args.json.write_text(json.dumps(details, indent=1))


if __name__ == "__main__":
    main()
