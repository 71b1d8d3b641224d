"""CI106 hand-written.

Reports: hand-written wiring: a site or hook holds upstream-style conditional canary wiring (`BODY if (c := MGR)
is not None [and not GUARD] else nullcontext()`, `self.canary_manager = install_canary(...)`, `if (c := MGR) is
not None: c.mark_init_finished()` / `c.attach_radix_cache(...)`); the message names the generated code `apply`
puts in its place

Why: Hand-written wiring drifts from the catalog; the generated form is the one check can compare and revert can
remove.

Fix: `apply` (migrates it, showing the diff with `--diff`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from canary_instrument.rewrite.findings import HAND_WRITTEN

if TYPE_CHECKING:
    from canary_instrument.catalog import Catalog
    from canary_instrument.rewrite.report import FileReport
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = HAND_WRITTEN


def check(parsed: ParsedFile, catalog: Catalog, report: FileReport) -> None:
    analysis = parsed.analysis
    for match in analysis.sites:
        if match.state == "handwritten":
            placeholder = match.placeholder
            report.findings.append(parsed.finding(
                match.anchor, CODE,
                f"{match.site.role} site in {match.where}: `{placeholder}` holds hand-written canary wiring; "
                f"`canary-instrument apply` migrates it to `{placeholder} = {match.wiring()}`",
            ))
    for hook in analysis.hooks:
        for present in hook.present:
            if present.handwritten is not None:
                report.findings.append(parsed.finding(
                    present.node, CODE,
                    f"{hook.hook.role} hook holds hand-written canary wiring; `canary-instrument apply` migrates "
                    f"it to `{present.migrated}`",
                ))
