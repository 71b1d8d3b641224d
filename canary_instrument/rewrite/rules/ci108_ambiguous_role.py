"""CI108 ambiguous-role.

Reports: a site whose shape fits two catalog roles that would wire it differently, equally well

Why: Two roles that fit equally well would wire the site differently; the tool never guesses which.

Fix: make one role more specific (`calls`, `requires`, `class_refs`, `loop`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import AMBIGUOUS_ROLE, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = AMBIGUOUS_ROLE


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for problem in parsed.analysis.problems:
        if problem.kind == "ambiguous":
            report.findings.append(parsed.finding(
                problem.node, CODE,
                f"`{problem.name}` fits the catalog roles {problem.detail} equally well; make one more specific "
                "(calls, requires, class_refs, loop) in the catalog",
            ))


def left_alone(parsed: ParsedFile, problem) -> Finding:
    """What a transform reports for a site two roles fit equally well, which it leaves as it is."""
    return parsed.finding(
        problem.node, CODE, f"`{problem.name}` fits the catalog roles {problem.detail} equally well; left alone",
    )
