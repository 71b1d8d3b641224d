"""CI208 unreachable-manager.

Reports: a class whose sites run on a manager whose expression reads an attribute the class never uses
(`self.draft_runner`), where the class holds no single model runner in its place; its sites are left as they are

Why: The generated member would read an attribute the class never has; the tool resolves the owner from the code
or reports it, never guesses.

Fix: set the manager's `expression` in the catalog
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import UNREACHABLE_MANAGER, Finding

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = UNREACHABLE_MANAGER


def unreachable_message(info, analysis) -> str:
    """CI208's message for a class whose sites' manager expression reads what the class never uses."""
    roles = sorted({m.site.role for m in analysis.sites if m.class_node is info.class_node})
    return (
        f"{info.class_node.name}: its {', '.join(roles)} site(s) run on the {info.manager.name} manager, "
        f"`{info.manager.expression}`, but the class never uses `{info.manager.owner}` and holds no single model "
        "runner in its place; its sites are left as they are (set the manager's expression in the catalog)"
    )


def findings(parsed: ParsedFile) -> list[Finding]:
    """One finding per class whose generated member would read what the class never uses (apply too)."""
    return [
        parsed.finding(info.class_node, CODE, unreachable_message(info, parsed.analysis))
        for info in parsed.analysis.unreachable
    ]


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    report.findings.extend(findings(parsed))
