"""CI105 incomplete-placeholder.

Reports: incomplete placeholder: `with canary_ctx` without its assignment, or an assignment that is neither the
placeholder factory nor generated wiring (hand-written code; the tool leaves it alone)

Why: A bracket without its assignment does not run, and an assignment the tool did not write is not its to
change: apply leaves both alone.

Fix: make it a placeholder
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import INCOMPLETE_PLACEHOLDER, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = INCOMPLETE_PLACEHOLDER


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    analysis = parsed.analysis
    for match in analysis.sites:
        if match.state == "other":
            report.findings.append(parsed.finding(
                match.anchor, CODE,
                f"{match.site.role} site in {match.where}: `{match.placeholder}` holds neither a placeholder "
                "nor generated wiring",
            ))
    for problem in analysis.problems:
        if problem.kind == "incomplete":
            report.findings.append(parsed.finding(problem.node, CODE, f"`{problem.name}` is used but never assigned"))


def left_alone(parsed: ParsedFile) -> list[Finding]:
    """What a transform reports for incomplete placeholders, which it leaves as they are."""
    analysis = parsed.analysis
    out = [
        parsed.finding(
            problem.node, CODE,
            f"`{problem.name}` is used but never assigned; add `{problem.name} = contextlib.nullcontext()` "
            "before it",
        )
        for problem in analysis.problems if problem.kind == "incomplete"
    ]
    out.extend(
        parsed.finding(
            match.anchor, CODE,
            f"{match.site.role} site: `{match.placeholder}` holds code that is neither a placeholder nor "
            "wiring; left alone (make it a placeholder to let the tool manage it)",
        )
        for match in analysis.sites if match.state == "other"
    )
    return out
