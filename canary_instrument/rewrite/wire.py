"""apply: turn placeholders into generated wiring (one `canary_ctx` member per class, one line per site, hooks)."""

from __future__ import annotations

import ast
import builtins
from collections import Counter

from canary_instrument.catalog import RUNTIME_EXPORTS, Catalog, Manager
from canary_instrument.rewrite.plan import EditPlan, key_of
from canary_instrument.rewrite.findings import MISSING_PLACEHOLDER, UNDEFINED_IN_WIRING
from canary_instrument.rewrite.layout import fit, indent_lines, line_limit
from canary_instrument.rewrite.locate import MEMBER_MARKER, FileAnalysis, Imports, SiteMatch, dotted_name, same_code
from canary_instrument.rewrite.scaffold import report_unusable
from canary_instrument.rewrite.tree import ParsedFile, RunResult, run_transform

MEMBER_SIGNATURE = "(self, forward_batch=None, *, outside=None, active=None)"
MEMBER_RETURN = "return canary_context(manager, forward_batch, outside=outside, active=active)"


def indentation(parsed: ParsedFile, node: ast.AST) -> str:
    return parsed.lines[node.lineno - 1][: node.col_offset]


def indent_unit(parsed: ParsedFile, cls: ast.ClassDef) -> str:
    """The file's indentation step, read from a class and its body."""
    outer = indentation(parsed, cls)
    inner = indentation(parsed, cls.body[0])
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
    return fit(f"{match.site.placeholder} = {match.wiring()}", indentation(parsed, match.assign), unit, limit)


def free_runtime_names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id in RUNTIME_EXPORTS}


def undefined_names(match: SiteMatch) -> list[str]:
    """Names the site's wiring reads that its method neither receives nor assigns (nor are builtins)."""
    wanted = {n.id for n in ast.walk(ast.parse(match.wiring(), mode="eval")) if isinstance(n, ast.Name)}
    arguments = match.method.args
    defined = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    defined |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for node in ast.walk(match.method):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    return sorted(name for name in wanted - defined if name not in dir(builtins))


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


def plan_apply(parsed: ParsedFile, catalog: Catalog, result: RunResult) -> EditPlan:
    plan = EditPlan()
    analysis = parsed.analysis
    report_unusable(parsed, result)
    limit = line_limit(parsed.source.text)
    names: set[str] = set()
    wired_classes = set()
    wired_factory_calls: list[SiteMatch] = []
    for match in analysis.sites:
        if match.state == "missing":
            result.findings.append(parsed.finding(
                match.first, MISSING_PLACEHOLDER,
                f"{match.site.role} site in {match.class_node.name}.{match.method.name} has no placeholder; "
                "run `canary-instrument scaffold` first",
            ))
            continue
        if match.state not in ("placeholder", "wired"):
            continue
        undefined = undefined_names(match)
        if undefined:
            result.findings.append(parsed.finding(
                match.anchor, UNDEFINED_IN_WIRING,
                f"{match.site.role} site: the wiring `{match.wiring()}` uses {', '.join(undefined)}, which "
                f"{match.class_node.name}.{match.method.name} does not define; left as it is (fix the "
                "catalog's wiring for this site)",
            ))
            continue
        wired_classes.add(id(match.class_node))
        unit = indent_unit(parsed, match.class_node)
        if match.state == "placeholder":
            wired_factory_calls.append(match)
        if match.state == "placeholder" or not same_code(match.assign.value, match.wiring()):
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
        names |= free_runtime_names(hook.hook.statement)
        if hook.present:
            continue
        unit = indent_unit(parsed, hook.class_node)
        text = fit(hook.hook.statement, indentation(parsed, hook.anchor), unit, limit)
        plan.insert_after.setdefault(key_of(hook.anchor, parsed.lines), []).append(text)
        plan.touched += 1
    if plan:
        plan.add_imports.extend((catalog.runtime_module, name) for name in sorted(names))
        plan.remove_imports.extend(imports_left_unused(analysis, wired_factory_calls, catalog.placeholder_factory))
    return plan


def apply_tree(paths, catalog: Catalog, *, write: bool = True) -> RunResult:
    """Wire every placeholder site, add the generated members, hooks and runtime imports."""
    return run_transform(paths, catalog, plan_apply, write=write)
