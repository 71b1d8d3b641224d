"""CI206 manager-conflict.

Reports: two sites in one class name different managers in the catalog

Why: A class has one generated member, which reads one manager; two managers in one class cannot both be served.

Fix: fix the catalog
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import MANAGER_CONFLICT

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = MANAGER_CONFLICT


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    for cls, first, second in parsed.analysis.manager_conflicts:
        report.findings.append(parsed.finding(
            cls, CODE,
            f"{cls.name} holds sites whose catalog managers differ ({first}, {second}); one member "
            "cannot serve both",
        ))
