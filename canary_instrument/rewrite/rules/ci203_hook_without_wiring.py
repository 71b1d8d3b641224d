"""CI203 hook-without-wiring.

Reports: half-wired: a hook is present but no site is wired

Why: A hook with no wired site installs a manager that checks nothing: a half-applied or half-reverted tree.

Fix: `apply` or `revert`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import HOOK_WITHOUT_WIRING

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = HOOK_WITHOUT_WIRING


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for hook in parsed.analysis.hooks:
        generated = [p for p in hook.present if p.handwritten is None]
        if generated:  # a finding only when no site of the tree is wired
            report.when_unwired.append(parsed.finding(
                generated[0].node, CODE,
                f"half-wired: the {hook.hook.role} hook is present but no site is wired; "
                "run `canary-instrument apply` (or `revert`)",
            ))
