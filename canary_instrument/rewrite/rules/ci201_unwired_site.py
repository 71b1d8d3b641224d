"""CI201 unwired-site.

Reports: half-wired: some site is wired but this one still holds a placeholder

Why: Wiring is all or nothing across a tree: a site left with its placeholder runs unchecked while the rest is
checked.

Fix: `apply`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import UNWIRED_SITE

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = UNWIRED_SITE


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for match in parsed.analysis.sites:
        if match.state == "placeholder":  # a finding only when some site of the tree is wired
            report.when_wired.append(parsed.finding(
                match.anchor, CODE,
                f"half-wired: {match.site.role} site in {match.where} still holds a placeholder while the tree "
                "is wired; run `canary-instrument apply`",
            ))
