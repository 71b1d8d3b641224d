"""CI107 unknown-hand-wiring.

Reports: hand-written canary wiring that no catalog role covers (e.g. a `canary_run_ctx` passed to a new kind of
warm-up run); the message holds the `[tool.canary-instrument]` entry that would cover it, ready to paste into
`pyproject.toml`

Why: Canary code no role covers is neither checked nor migrated: the catalog must learn its site first.

Fix: add the entry (review its `calls`, `manager`, `wiring`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import UNKNOWN_HAND_WIRING, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = UNKNOWN_HAND_WIRING


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for problem in parsed.analysis.problems:
        if problem.kind == "unknown":
            report.findings.append(parsed.finding(
                problem.node, CODE,
                f"`{problem.name}` holds hand-written canary wiring that no catalog role covers; to let the tool "
                f"manage it, add under [tool.canary-instrument]: {problem.detail}",
            ))


def left_alone(parsed: ParsedFile, problem) -> Finding:
    """What a transform reports for hand-written wiring no role covers, which it leaves as it is."""
    return parsed.finding(
        problem.node, CODE,
        f"`{problem.name}` holds hand-written canary wiring no catalog role covers; left alone "
        f"(add under [tool.canary-instrument]: {problem.detail})",
    )
