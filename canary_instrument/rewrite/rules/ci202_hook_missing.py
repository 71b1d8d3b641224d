"""CI202 hook-missing.

Reports: half-wired: sites are wired but an install or init-finished hook is missing

Why: Without its install or init-finished hook the wired sites have no manager, or one that never starts
checking.

Fix: `apply`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import HOOK_MISSING

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = HOOK_MISSING


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for hook in parsed.analysis.hooks:
        if not hook.present:  # a finding only when some site of the tree is wired
            report.when_wired.append(parsed.finding(
                hook.anchor, CODE,
                f"half-wired: the {hook.hook.role} hook `{hook.statement}` is missing in {hook.where}; "
                "run `canary-instrument apply`",
            ))
