"""CI106 hand-written.

Reports: hand-written wiring: a site or hook holds upstream-style conditional canary wiring (`BODY if (c := MGR)
is not None [and not GUARD] else nullcontext()`, `self.canary_manager = install_canary(...)`, `if (c := MGR) is
not None: c.mark_init_finished()` / `c.attach_radix_cache(...)`); the message names the generated code `apply`
puts in its place

Why: Hand-written wiring drifts from the catalog; the generated form is the one check can compare and revert can
remove.

Fix: `apply` (migrates it, showing the diff with `--diff`)
"""

from canary_instrument.rewrite.findings import HAND_WRITTEN as CODE
from canary_instrument.rewrite.rules.select import Reported, together


def handwritten_hooks(parsed, catalog, report) -> None:
    for hook in parsed.analysis.hooks:
        for present in hook.present:
            if present.handwritten is not None:
                report.findings.append(parsed.finding(
                    present.node, CODE,
                    f"{hook.hook.role} hook holds hand-written canary wiring; `canary-instrument apply` migrates "
                    f"it to `{present.migrated}`",
                ))


check = together(Reported(
    CODE, "sites", "handwritten", at="anchor",
    message=lambda match: f"{match.site.role} site in {match.where}: `{match.placeholder}` holds hand-written "
    f"canary wiring; `canary-instrument apply` migrates it to `{match.placeholder} = {match.wiring()}`",
).check, handwritten_hooks)
