"""CI104 duplicated-placeholder.

Reports: duplicated placeholder in a site's method, or a duplicated hook

Why: One site holds one placeholder and a hook runs once: a second one would be wired twice or left behind.

Fix: remove the extra one
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import DUPLICATED_PLACEHOLDER

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = DUPLICATED_PLACEHOLDER


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    analysis = parsed.analysis
    for hook in analysis.hooks:
        for present in hook.present[1:]:
            report.findings.append(parsed.finding(present.node, CODE, f"duplicated {hook.hook.role} hook"))
    for problem in analysis.problems:
        if problem.kind == "duplicated":
            report.findings.append(parsed.finding(
                problem.node, CODE,
                f"duplicated placeholder `{problem.name}`: its site already has one; remove this one",
            ))
