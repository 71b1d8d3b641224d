"""CI104 duplicated-placeholder.

Reports: duplicated placeholder in a site's method, or a duplicated hook

Why: One site holds one placeholder and a hook runs once: a second one would be wired twice or left behind.

Fix: remove the extra one
"""

from canary_instrument.rewrite.findings import DUPLICATED_PLACEHOLDER as CODE
from canary_instrument.rewrite.rules.select import Reported, together


def duplicated_hooks(parsed, catalog, report) -> None:
    for hook in parsed.analysis.hooks:
        for present in hook.present[1:]:
            report.findings.append(parsed.finding(present.node, CODE, f"duplicated {hook.hook.role} hook"))


check = together(duplicated_hooks, Reported(
    CODE, "problems", "duplicated",
    message=lambda problem: f"duplicated placeholder `{problem.name}`: its site already has one; remove this one",
).check)
