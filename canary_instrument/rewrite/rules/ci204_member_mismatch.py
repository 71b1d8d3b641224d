"""CI204 member-mismatch.

Reports: half-wired: a class with wired sites lacks its generated member, or a generated member remains in a
class with no wired site

Why: Wired sites call the class's generated member; a class without it fails at run time, and a member no site
calls is left over from a revert.

Fix: `apply` or `revert`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import MEMBER_MISMATCH

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = MEMBER_MISMATCH


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    analysis = parsed.analysis
    for info in analysis.members:
        class_wired = any(m.state == "wired" and m.class_node is info.class_node for m in analysis.sites)
        if class_wired and info.node is None:
            report.findings.append(parsed.finding(
                info.class_node, CODE,
                f"half-wired: {info.class_node.name} has wired sites but no `{catalog.member}` member; "
                "run `canary-instrument apply`",
            ))
        elif info.node is not None and info.generated and not class_wired:
            report.findings.append(parsed.finding(
                info.node, CODE,
                f"half-wired: generated `{catalog.member}` in {info.class_node.name} but none of its sites "
                "is wired; run `canary-instrument apply` (or `revert`)",
            ))
