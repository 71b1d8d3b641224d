"""revert: wiring back to placeholders, removing the generated members, hooks and runtime imports.

Generated wiring and upstream's hand-written wiring both go back to the placeholder
(`NAME = contextlib.nullcontext()`), and their hooks are removed, so revert gives the clean
placeholder state of a wired tree, of a migrated one and of upstream's hand-wired one.
"""

from __future__ import annotations

from canary_instrument.catalog import RUNTIME_EXPORTS, Catalog
from canary_instrument.rewrite.transforms.apply import imports_of, report_unhandled
from canary_instrument.rewrite.transforms.plan import EditPlan, key_of
from canary_instrument.rewrite.transforms.scaffold import factory_spelling, report_unusable
from canary_instrument.rewrite.analysis.tree import ParsedFile, RunResult
from canary_instrument.rewrite.transforms.runner import run_transform


def plan_revert(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
    plan = EditPlan()
    analysis = parsed.analysis
    report_unusable(parsed, result)
    report_unhandled(parsed, result)
    wired = [m for m in analysis.sites if m.state in ("wired", "handwritten")]
    reads: set[str] = set()
    if wired:
        spelling = factory_spelling(parsed, catalog, plan)
        for match in wired:
            plan.replace_value[key_of(match.assign, parsed.lines)] = f"{match.placeholder} = {spelling}()"
            plan.touched += 1
            if match.handwired is not None:
                reads |= match.handwired.reads
    for info in analysis.members:
        if info.node is not None and info.generated:
            plan.remove.add(key_of(info.node, parsed.lines))
    for hook in analysis.hooks:
        for present in hook.present:
            plan.remove.add(key_of(present.node, parsed.lines))
            plan.touched += 1
            if present.handwritten is not None:
                reads |= present.handwritten.reads
    if plan:
        plan.remove_imports.extend((catalog.runtime_module, name, None) for name in RUNTIME_EXPORTS)
        # What the hand-written code alone imported (its null context, context_tuple, install_canary).
        placeholder_module = catalog.placeholder_factory.rpartition(".")[0]
        plan.remove_imports.extend(
            entry for entry in imports_of(reads, analysis.imports) if entry[0] != placeholder_module
        )
    return plan


def revert_tree(paths, catalog: Catalog, *, write: bool = True) -> RunResult:
    """Put placeholders back where apply (or upstream's hand) wired, and remove everything apply generated."""
    return run_transform(paths, catalog, plan_revert, write=write)
