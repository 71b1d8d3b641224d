"""apply: turn placeholders (and upstream's hand-written wiring) into generated wiring.

One `canary_ctx` member per participating class, one line per site (a direct
`canary_context(...)` call in a module-level function), the hooks where their shape says,
and the runtime import in its isort section. Hand-written sites and hooks are migrated in
place; the upstream imports they alone used are removed.
"""

from __future__ import annotations

import ast
from collections import Counter

from canary_instrument.catalog import RUNTIME_EXPORTS, Catalog, Manager
from canary_instrument.rewrite.check import uncovered_forwards
from canary_instrument.rewrite.analysis.layout import fit, indent_lines, line_limit
from canary_instrument.rewrite.analysis.locate import MEMBER_MARKER, FileAnalysis, Imports, SiteMatch, dotted_name
from canary_instrument.rewrite.analysis.placement import Placement, placement_of
from canary_instrument.rewrite.rules import (
    ci101_missing_placeholder,
    ci102_site_not_found,
    ci103_stray_placeholder,
    ci107_unknown_hand_wiring,
    ci108_ambiguous_role,
    ci207_undefined_in_wiring,
    ci208_unreachable_manager,
)
from canary_instrument.rewrite.rules.select import Reported
from canary_instrument.rewrite.syntax.nodes import same_code
from canary_instrument.rewrite.transforms.plan import EditPlan, key_of
from canary_instrument.rewrite.transforms.scaffold import report_unusable
from canary_instrument.rewrite.analysis.tree import ParsedFile, RunResult
from canary_instrument.rewrite.transforms.runner import run_transform

MEMBER_SIGNATURE = "(self, forward_batch=None, *, outside=None, active=None)"
MEMBER_RETURN = "return canary_context(manager, forward_batch, outside=outside, active=active)"


def indentation(parsed: ParsedFile, node: ast.AST) -> str:
    return parsed.lines[node.lineno - 1][: node.col_offset]


def indent_unit(parsed: ParsedFile, node: ast.AST) -> str:
    """The file's indentation step, read from a class or function and its body."""
    outer = indentation(parsed, node)
    inner = indentation(parsed, node.body[0])
    return inner[len(outer):] or "    "


def render_member(catalog: Catalog, manager: Manager, indent: str, unit: str, limit: int) -> str:
    """The generated member, at column 0, for a class body indented by `indent`."""
    expression = f"None if {manager.guard} else {manager.expression}" if manager.guard else manager.expression
    body = indent + unit
    return "\n".join([
        MEMBER_MARKER,
        f"def {catalog.member}{MEMBER_SIGNATURE}:",
        indent_lines(fit(f"manager = {expression}", body, unit, limit), unit),
        indent_lines(fit(MEMBER_RETURN, body, unit, limit), unit),
    ])


def site_statement(parsed: ParsedFile, match: SiteMatch, unit: str, limit: int) -> str:
    return fit(f"{match.placeholder} = {match.wiring()}", indentation(parsed, match.assign), unit, limit)


def free_runtime_names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id in RUNTIME_EXPORTS}


def factory_local(match: SiteMatch) -> str:
    """The local name a placeholder calls its factory through (`contextlib`, `cl`, `nullcontext`)."""
    return dotted_name(match.assign.value.func).split(".")[0]


def factory_import(local: str, imports: Imports, factory: str) -> tuple[str, str | None, str | None]:
    """The import (module, name, alias) that binds `local` to the factory or its module."""
    target = imports.names.get(local, local)
    module, _, attribute = factory.rpartition(".")
    if target == factory:
        return module, attribute, None if local == attribute else local
    if local != target:
        return target, None, local
    return module, None, None


def imports_left_unused(
    analysis: FileAnalysis, wired: list[SiteMatch], factory: str
) -> list[tuple[str, str | None, str | None]]:
    """The factory imports that nothing but the placeholders apply wires reads.

    A cheap ast count keeps libcst's RemoveImportsVisitor (a full scope analysis, which has the
    final say) off files that use the import elsewhere, such as the model runner.
    """
    reads = Counter(n.id for n in ast.walk(analysis.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    wired_reads = Counter(factory_local(match) for match in wired)
    return [
        factory_import(local, analysis.imports, factory)
        for local, count in sorted(wired_reads.items()) if reads[local] <= count
    ]


def imports_of(names, imports: Imports) -> list[tuple[str, str | None, str | None]]:
    """The import bindings (module, name, alias) of local names, for RemoveImportsVisitor (which keeps used ones)."""
    found = []
    for local in sorted(names):
        target = imports.names.get(local)
        if target is None:
            continue
        module, _, attribute = target.rpartition(".")
        if local == target.split(".")[0] and "." not in target:
            found.append((target, None, None))  # import contextlib
        elif module:
            found.append((module, attribute, None if local == attribute else local))
        else:
            found.append((target, None, local))  # import x as y
    return found


def report_unhandled(parsed: ParsedFile, result: RunResult) -> None:
    """Canary code the transform leaves alone because no role (or more than one) covers it."""
    for problem in parsed.analysis.problems:
        report = _LEFT_ALONE.get(problem.kind)
        if report is not None:
            result.findings.append(report(parsed, problem))


# The problem kinds a transform leaves alone, each with what its rule reports for it.
_LEFT_ALONE = {
    row.which: row.left_alone
    for row in map(Reported.of_module, (ci107_unknown_hand_wiring, ci108_ambiguous_role, ci103_stray_placeholder))
}
_MISSING = Reported.of_module(ci101_missing_placeholder)


def report_unreachable(parsed: ParsedFile, result: RunResult) -> set[int]:
    """Classes whose generated member would read an attribute the class never uses: reported, left unwired."""
    result.findings.extend(ci208_unreachable_manager.findings(parsed))
    return {id(info.class_node) for info in parsed.analysis.unreachable}


def plan_apply(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
    plan = EditPlan()
    analysis = parsed.analysis
    report_unusable(parsed, result)
    report_unhandled(parsed, result)
    limit = line_limit(parsed.source.text)
    names: set[str] = set()
    migrated_reads: set[str] = set()
    wired_classes = set()
    wired_factory_calls: list[SiteMatch] = []
    unreachable = report_unreachable(parsed, result)
    for match in analysis.sites:
        if id(match.class_node) in unreachable:
            continue
        if match.state == "missing":
            result.findings.append(_MISSING.left_alone(parsed, match))
            continue
        if match.state not in ("placeholder", "wired", "handwritten"):
            continue
        undefined = ci207_undefined_in_wiring.site_finding(parsed, match)
        if undefined is not None:
            result.findings.append(undefined)
            continue
        if match.module_level:
            names |= free_runtime_names(match.wiring())
        else:
            wired_classes.add(id(match.class_node))
        owner = match.class_node if match.class_node is not None else match.method
        unit = indent_unit(parsed, owner)
        if match.state == "placeholder":
            wired_factory_calls.append(match)
        elif match.state == "handwritten":
            migrated_reads |= match.handwired.reads
        if match.state != "wired" or not match.conforms():
            plan.replace_value[key_of(match.assign, parsed.lines)] = site_statement(parsed, match, unit, limit)
            plan.touched += 1
    for info in analysis.members:
        if id(info.class_node) not in wired_classes:
            continue
        unit = indent_unit(parsed, info.class_node)
        text = render_member(catalog, info.manager, indentation(parsed, info.class_node.body[0]), unit, limit)
        names |= free_runtime_names(text.split("\n", 1)[1])
        if info.node is None:
            plan.append_to_class[key_of(info.class_node, parsed.lines)] = [text]
        elif info.generated and not same_code(info.node, text.split("\n", 1)[1]):
            plan.remove.add(key_of(info.node, parsed.lines))
            plan.append_to_class[key_of(info.class_node, parsed.lines)] = [text]
    for hook in analysis.hooks:
        for present in hook.present:
            if present.handwritten is not None:
                scope = present.node
                text = fit(present.migrated, indentation(parsed, scope), _unit_near(parsed, hook), limit)
                plan.replace_statement[key_of(present.node, parsed.lines)] = text
                migrated_reads |= present.handwritten.reads
                names |= free_runtime_names(present.migrated)
                plan.touched += 1
            else:
                names |= free_runtime_names(ast.unparse(present.node))
        if hook.present or hook.anchor is None:
            continue
        text = fit(hook.statement, indentation(parsed, hook.anchor), _unit_near(parsed, hook), limit)
        # Before a statement: above its blank lines and comments, which stay with it (and revert,
        # removing the hook alone, gives the file back byte for byte).
        where = plan.insert_after if hook.mode == "after" else plan.insert_above
        where.setdefault(key_of(hook.anchor, parsed.lines), []).append(text)
        names |= free_runtime_names(hook.statement)
        plan.touched += 1
    if plan:
        plan.runtime_import = (catalog.runtime_module, tuple(sorted(names)))
        # A name the runtime import brings that the file imports from elsewhere (upstream's own
        # `install_canary`) would shadow or be shadowed by it: that import goes.
        for name in sorted(names):
            bound = analysis.imports.names.get(name)
            module, _, attribute = (bound or "").rpartition(".")
            if bound is not None and module != catalog.runtime_module and attribute == name:
                plan.drop_imports.append((module, name))
        plan.own_packages = own_packages(parsed.path)
        plan.remove_imports.extend(imports_left_unused(analysis, wired_factory_calls, catalog.placeholder_factory))
        plan.remove_imports.extend(imports_of(migrated_reads, analysis.imports))
    return plan


def _unit_near(parsed: ParsedFile, hook) -> str:
    owner = hook.class_node if hook.class_node is not None else hook.method
    if owner is None:
        return "    "
    return indent_unit(parsed, owner)


def own_packages(path) -> frozenset[str]:
    """Top-level names that are this file's own package (isort's first party): the folders it sits in."""
    from pathlib import Path

    resolved = Path(path).resolve()
    return frozenset(part for part in resolved.parent.parts if part.isidentifier())


def apply_tree(paths, catalog: Catalog, *, write: bool = True) -> RunResult:
    """Wire every placeholder site (and migrate hand-written wiring), add the generated members, hooks and imports;
    report (exit 1) each role the tree expects and each hook its wiring needs that no file has a place for,
    and each forward path that runs outside every site (CI301, as `check` finds it)."""
    placements: list[Placement] = []

    def plan(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
        placements.append(placement_of(parsed.path, parsed.analysis, catalog, parsed.position))
        return plan_apply(parsed, catalog, result)

    result = run_transform(paths, catalog, plan, write=write)
    result.findings.extend(ci102_site_not_found.tree_check(placements, catalog))
    if catalog.triggers:
        # Read after the writes (the lines `check` will report); with nothing written, the tree as it is.
        result.findings.extend(uncovered_forwards(paths, catalog))
    result.findings.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return result
