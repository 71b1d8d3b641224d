"""CI103 stray-placeholder.

Reports: stray placeholder: a canary-named placeholder assignment or `with` item outside every catalogued site

Why: A placeholder outside every site is never wired (or wired where no role admits it): it guards nothing the
catalog knows.

Fix: remove it, or catalogue its site
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import STRAY_PLACEHOLDER, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = STRAY_PLACEHOLDER


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for problem in parsed.analysis.problems:
        if problem.kind not in ("duplicated", "incomplete", "unknown", "ambiguous"):
            report.findings.append(parsed.finding(
                problem.node, CODE,
                f"stray placeholder `{problem.name}` ({problem.detail}); remove it, or add its site to the catalog",
            ))


def left_alone(parsed: ParsedFile, problem) -> Finding:
    """What a transform reports for a stray placeholder it leaves as it is."""
    return parsed.finding(
        problem.node, CODE,
        f"stray placeholder `{problem.name}` ({problem.detail}); left alone: no catalog role admits it "
        "here (remove it, or add its site to the catalog)",
    )
