"""scaffold: insert no-op placeholders (`canary_ctx = contextlib.nullcontext()` + `with canary_ctx:`) at every site.

Before anything is written, the output minus the inserted wrappers must be AST-identical to
the input (`prove_no_op`); a file that fails the proof is refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

from canary_instrument.catalog import Catalog, Location
from canary_instrument.rewrite.io.files import SourceError
from canary_instrument.rewrite.findings import NOT_A_NO_OP
from canary_instrument.rewrite.analysis.locate import FileAnalysis, _is_wrapper, analyse
from canary_instrument.rewrite.check import uncovered_graph
from canary_instrument.rewrite.rules import ci105_incomplete_placeholder
from canary_instrument.rewrite.rules import ci301_uncovered_forward as ci301
from canary_instrument.rewrite.transforms.cover import plan_cover
from canary_instrument.rewrite.transforms.plan import EditPlan, key_of
from canary_instrument.rewrite.analysis.tree import ParsedFile, RunResult, split_lines
from canary_instrument.rewrite.transforms.runner import run_transform


def factory_spelling(parsed: ParsedFile, catalog: Catalog, plan: EditPlan) -> str:
    """How this file calls the placeholder factory; queues an import when it has none."""
    spelling = parsed.analysis.imports.spelling(catalog.placeholder_factory)
    if spelling is None:
        module = catalog.placeholder_factory.rpartition(".")[0]
        plan.add_imports.append((module, None))
        spelling = catalog.placeholder_factory
    return spelling


def report_unusable(parsed: ParsedFile, result: RunResult) -> None:
    """Incomplete placeholders, which the transforms leave as they are."""
    result.findings.extend(ci105_incomplete_placeholder.left_alone(parsed))


def plan_scaffold(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
    plan = EditPlan()
    report_unusable(parsed, result)
    missing = [m for m in parsed.analysis.sites if m.state == "missing"]
    if not missing:
        return plan
    spelling = factory_spelling(parsed, catalog, plan)
    for match in missing:
        placeholder = match.site.placeholder
        assignment = f"{placeholder} = {spelling}()"
        first = key_of(match.first, parsed.lines)
        if match.site.shape == "wrap":
            plan.wrap[first] = (key_of(match.last, parsed.lines), assignment, f"with {placeholder}:")
        else:
            plan.insert_before[first] = [assignment]
            plan.add_item[first] = (placeholder, match.site.item)
        plan.touched += 1
    return plan


def strip_placeholders(analysis: FileAnalysis, factory_module: str) -> str:
    """ast.dump of the tree with every placeholder (assignment, wrapper, with item) and factory import removed."""
    for match in analysis.sites:
        if match.state != "placeholder" or match.wrapper is None:
            continue
        block = match.wrapper_block
        block.remove(match.assign)
        if _is_wrapper(match.wrapper, match.placeholder):
            position = next(i for i, stmt in enumerate(block) if stmt is match.wrapper)
            block[position : position + 1] = match.wrapper.body
        else:
            match.wrapper.items[:] = [
                item for item in match.wrapper.items
                if not (isinstance(item.context_expr, ast.Name) and item.context_expr.id == match.placeholder)
            ]
    body = analysis.tree.body
    body[:] = [
        stmt for stmt in body
        if not (isinstance(stmt, ast.Import) and [a.name for a in stmt.names] == [factory_module] and not stmt.names[0].asname)
    ]
    return ast.dump(analysis.tree)


def prove_no_op(parsed: ParsedFile, new_text: str, catalog: Catalog) -> None:
    """Refuse (SourceError) unless the scaffolded text minus its placeholders is the input's AST."""
    module = catalog.placeholder_factory.rpartition(".")[0]
    new_lines = split_lines(new_text)
    new = analyse(parsed.path, ast.parse(new_text), catalog, new_lines)
    old = analyse(parsed.path, ast.parse(parsed.source.text), catalog, parsed.lines)
    unscaffolded = [m.site.role for m in new.sites if m.state == "missing"]
    if unscaffolded or strip_placeholders(new, module) != strip_placeholders(old, module):
        detail = f"sites left without placeholder: {', '.join(unscaffolded)}" if unscaffolded else (
            "removing the placeholders does not give back the input's AST"
        )
        raise SourceError(parsed.path, 1, 1, NOT_A_NO_OP, f"scaffold refused, nothing written: {detail}")


def scaffold_tree(paths, catalog: Catalog, *, write: bool = True) -> RunResult:
    """Insert placeholders at every located site that has none, and on every forward path that runs
    outside every site where a role's shape places one (`transforms.cover`); write only proven no-op
    changes. A forward path no role can be placed on is reported (CI301)."""
    catalog, unplaced = covering_catalog(paths, catalog)
    result = run_transform(
        paths, catalog, plan_scaffold, write=write,
        verify=lambda parsed, new_text: prove_no_op(parsed, new_text, catalog),
    )
    result.findings.extend(unplaced)
    result.findings.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return result


def covering_catalog(paths, catalog: Catalog) -> tuple[Catalog, list]:
    """The catalog with a location hint for each site that covers an uncovered forward path, and CI301's
    findings for the paths none covers."""
    _, graph = uncovered_graph(paths, catalog)
    if graph is None:
        return catalog, []
    placements, unplaced = plan_cover(graph, catalog)
    hints: dict[str, tuple[Location, ...]] = {}
    for place in placements:
        location = Location(
            path=Path(place.path).as_posix(), classes=(place.cls,), methods=(place.method,), lines=place.lines)
        hints[place.role] = hints.get(place.role, ()) + (location,)
    via = ci301.exposed(graph) if unplaced else {}
    findings = [ci301.finding(graph, key, trigger, via) for key, trigger, _ in unplaced]
    return catalog.with_locations(hints), findings
