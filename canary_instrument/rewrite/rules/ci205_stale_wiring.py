"""CI205 stale-wiring.

Reports: a wired site differs from what the catalog generates (stale wiring)

Why: Wiring that differs from what the catalog generates was edited by hand or generated from an older catalog.

Fix: `apply`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import STALE_WIRING

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = STALE_WIRING


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for match in parsed.analysis.sites:
        if match.state == "wired" and not match.conforms():
            report.findings.append(parsed.finding(
                match.anchor, CODE,
                f"{match.site.role} site in {match.where} is wired differently from the catalog ({match.wiring()}); "
                "run `canary-instrument apply`",
            ))
