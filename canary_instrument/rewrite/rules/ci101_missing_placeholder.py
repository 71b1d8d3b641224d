"""CI101 missing-placeholder.

Reports: a catalogued site holds no placeholder

Why: Apply wires placeholders: a site without one stays unguarded, its KV reads unchecked, until scaffold gives
it one.

Fix: `canary-instrument scaffold`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import MISSING_PLACEHOLDER, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = MISSING_PLACEHOLDER


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for match in parsed.analysis.sites:
        if match.state == "missing":
            report.findings.append(parsed.finding(
                match.first, CODE,
                f"{match.site.role} site in {match.where} has no `{match.placeholder}` placeholder; "
                "run `canary-instrument scaffold`",
            ))


def apply_finding(parsed: ParsedFile, match) -> Finding:
    """What apply reports for a site it cannot wire for want of a placeholder."""
    return parsed.finding(
        match.first, CODE,
        f"{match.site.role} site in {match.where} has no placeholder; run `canary-instrument scaffold` first",
    )
