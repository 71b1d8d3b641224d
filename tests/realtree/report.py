"""The per-release table of docs/sglang.md, measured: the real-tree pipeline of test_releases.py, per release.

    CANARY_INSTRUMENT_SGLANG_CACHE=/work/sglang_cache .venv/bin/python tests/realtree/report.py 0.5.13 0.5.20

prints one markdown row per release (sites wired / expected, hooks placed / expected, `check` findings by
code on the hand-wired tree, on the placeholder tree and after `apply`, `apply --check`, `revert`) and
writes the details (hooks by file and function, findings by file) as JSON next to the table if `--json`
names a file. The numbers come from the same `outcome()` the tests assert on.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `realtree` as the package pytest imports

from realtree.conftest import RELEASES  # noqa: E402
from realtree.test_releases import outcome  # noqa: E402


def codes(result) -> str:
    counted = Counter(f.code for f in result.findings)
    return ", ".join(f"{code}×{n}" for code, n in sorted(counted.items())) or "none"


def row(version: str) -> tuple[str, dict]:
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_utime
    run = outcome(version)
    wall, cpu = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu
    upstream = {(rel, call, function) for rel, hooks in run.expected.hooks.items() for call, function in hooks}
    placed = upstream & set(run.hooks)
    extra = sorted(set(run.hooks) - upstream)
    apply_check = "0" if run.place_again.exit_code == 0 and not run.place_again.changes else "1"
    hand_apply_check = "0" if run.hand_again.exit_code == 0 and not run.hand_again.changes else "1"
    revert = "identical" if not run.place_reverted else f"{len(run.place_reverted)} files differ"
    hand_revert = "identical" if not run.hand_reverted else f"{len(run.hand_reverted)} files differ"
    line = (
        f"| {version} | {run.wired} / {run.expected.site_count} | {run.hand_wired} / {run.expected.site_count} "
        f"| {len(placed)} / {len(upstream)}{f' (+{len(extra)})' if extra else ''} "
        f"| {codes(run.hand_check)} | {codes(run.hand_after)} | {codes(run.place_check)} | {codes(run.place_after)} "
        f"| {apply_check} / {hand_apply_check} | {revert} / {hand_revert} |"
    )
    details = {
        "version": version,
        "sites_expected": run.expected.sites,
        "hooks_expected": sorted(upstream),
        "hooks_placed": run.hooks,
        "hooks_extra": extra,
        "findings": {
            stage: [f"{f.code} {f.path}:{f.line} {f.message.splitlines()[0]}" for f in result.findings]
            for stage, result in (("hand_check", run.hand_check), ("hand_after", run.hand_after),
                                  ("place_check", run.place_check), ("place_after", run.place_after))
        },
        "errors": [str(e) for r in (run.hand_check, run.hand_apply, run.place_check, run.place_apply) for e in r.errors],
        "files_changed_by_apply": sorted(str(c.path.relative_to(run.reference.parents[2] / "place"))
                                         for c in run.place_apply.changes),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
    }
    return line, details


HEADER = (
    "| release | sites wired / expected (placeholder) | sites migrated / expected (hand-wired) "
    "| hooks placed / expected | `check` hand-wired | `check` hand-wired after `apply` | `check` placeholder "
    "| `check` placeholder after `apply` | `apply --check` (placeholder / migrated) | `revert` (placeholder / migrated) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=RELEASES)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(HEADER, flush=True)
    all_details = []
    for version in args.versions:
        line, details = row(version)
        print(line, flush=True)
        all_details.append(details)
        if args.json:
            args.json.write_text(json.dumps(all_details, indent=1, default=str))


if __name__ == "__main__":
    main()
