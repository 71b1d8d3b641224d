"""revert: generated wiring back to placeholders, removing the generated members, hooks and runtime imports."""

from __future__ import annotations

from canary_instrument.catalog import RUNTIME_EXPORTS, Catalog
from canary_instrument.rewrite.plan import EditPlan, key_of
from canary_instrument.rewrite.scaffold import factory_spelling, report_unusable
from canary_instrument.rewrite.tree import ParsedFile, RunResult, run_transform


def plan_revert(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
    plan = EditPlan()
    analysis = parsed.analysis
    report_unusable(parsed, result)
    wired = [m for m in analysis.sites if m.state == "wired"]
    if wired:
        spelling = factory_spelling(parsed, catalog, plan)
        for match in wired:
            plan.replace_value[key_of(match.assign, parsed.lines)] = f"{match.site.placeholder} = {spelling}()"
            plan.touched += 1
    for info in analysis.members:
        if info.node is not None and info.generated:
            plan.remove.add(key_of(info.node, parsed.lines))
    for hook in analysis.hooks:
        for statement, _ in hook.present:
            plan.remove.add(key_of(statement, parsed.lines))
            plan.touched += 1
    if plan:
        plan.remove_imports.extend((catalog.runtime_module, name, None) for name in RUNTIME_EXPORTS)
    return plan


def revert_tree(paths, catalog: Catalog, *, write: bool = True) -> RunResult:
    """Put placeholders back where apply wired, and remove everything apply generated."""
    return run_transform(paths, catalog, plan_revert, write=write)
