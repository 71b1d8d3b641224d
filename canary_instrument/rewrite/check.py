"""check: the pre-commit gate. Every site holds a placeholder or its wiring, nothing stray, nothing half-wired,
no forward path in a class that no site covers. Standard library only (no libcst), candidate files only.
"""

from __future__ import annotations

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite import findings as codes
from canary_instrument.rewrite.files import SourceError
from canary_instrument.rewrite.locate import same_code
from canary_instrument.rewrite.tree import ParsedFile, RunResult, candidates, load, screen_round_trip


def check_tree(paths, catalog: Catalog) -> RunResult:
    result = RunResult()
    parsed_files: list[ParsedFile] = []
    for path in candidates(paths, catalog, result):
        try:
            parsed = load(path, catalog)
            if parsed.analysis.sites or parsed.analysis.hooks:
                screen_round_trip(parsed)
            parsed_files.append(parsed)
        except SourceError as error:
            result.errors.append(error)
    result.files_analysed = len(parsed_files)
    result.findings.extend(tree_findings(parsed_files, catalog))
    result.findings.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return result


def tree_findings(parsed_files: list[ParsedFile], catalog: Catalog):
    """Findings for a whole tree: wiring is all-or-nothing across files, so the rules look at every file."""
    sites = [(p, m) for p in parsed_files for m in p.analysis.sites]
    hooks = [(p, h) for p in parsed_files for h in p.analysis.hooks]
    wired = any(m.state == "wired" for _, m in sites)

    located_roles = {m.site.role for _, m in sites} | {h.hook.role for _, h in hooks}
    reported_roles = set()
    for parsed in parsed_files:
        for role in sorted(parsed.analysis.roles_expected - located_roles - reported_roles):
            reported_roles.add(role)
            yield parsed.finding(
                None, codes.SITE_NOT_FOUND,
                f"{role}: this file matches the catalog's path but no candidate class, method and statement "
                "shape is in it; extend the catalog (--catalog or [tool.canary-instrument])",
            )

    for parsed, match in sites:
        role, placeholder = match.site.role, match.site.placeholder
        where = f"{match.class_node.name}.{match.method.name}"
        if match.state == "missing":
            yield parsed.finding(
                match.first, codes.MISSING_PLACEHOLDER,
                f"{role} site in {where} has no `{placeholder}` placeholder; run `canary-instrument scaffold`",
            )
        elif match.state == "incomplete":
            yield parsed.finding(
                match.anchor, codes.INCOMPLETE_PLACEHOLDER,
                f"{role} site in {where}: `{placeholder}` is used but never assigned",
            )
        elif match.state == "other":
            yield parsed.finding(
                match.anchor, codes.INCOMPLETE_PLACEHOLDER,
                f"{role} site in {where}: `{placeholder}` holds neither a placeholder nor generated wiring",
            )
        elif match.state == "placeholder" and wired:
            yield parsed.finding(
                match.anchor, codes.UNWIRED_SITE,
                f"half-wired: {role} site in {where} still holds a placeholder while the tree is wired; "
                "run `canary-instrument apply`",
            )
        elif match.state == "wired" and not same_code(match.assign.value, match.wiring()):
            yield parsed.finding(
                match.anchor, codes.STALE_WIRING,
                f"{role} site in {where} is wired differently from the catalog ({match.wiring()}); "
                "run `canary-instrument apply`",
            )

    for parsed, hook in hooks:
        if wired and not hook.present:
            yield parsed.finding(
                hook.anchor, codes.HOOK_MISSING,
                f"half-wired: the {hook.hook.role} hook is missing after this statement in "
                f"{hook.class_node.name}.{hook.method.name}; run `canary-instrument apply`",
            )
        elif not wired and hook.present:
            yield parsed.finding(
                hook.present[0][0], codes.HOOK_WITHOUT_WIRING,
                f"half-wired: the {hook.hook.role} hook is present but no site is wired; "
                "run `canary-instrument apply` (or `revert`)",
            )
        for statement, _ in hook.present[1:]:
            yield parsed.finding(statement, codes.DUPLICATED_PLACEHOLDER, f"duplicated {hook.hook.role} hook")

    for parsed in parsed_files:
        analysis = parsed.analysis
        for info in analysis.members:
            class_wired = any(m.state == "wired" and m.class_node is info.class_node for m in analysis.sites)
            if class_wired and info.node is None:
                yield parsed.finding(
                    info.class_node, codes.MEMBER_MISMATCH,
                    f"half-wired: {info.class_node.name} has wired sites but no `{catalog.member}` member; "
                    "run `canary-instrument apply`",
                )
            elif info.node is not None and info.generated and not class_wired:
                yield parsed.finding(
                    info.node, codes.MEMBER_MISMATCH,
                    f"half-wired: generated `{catalog.member}` in {info.class_node.name} but none of its sites "
                    "is wired; run `canary-instrument apply` (or `revert`)",
                )
        for cls, first, second in analysis.manager_conflicts:
            yield parsed.finding(
                cls, codes.MANAGER_CONFLICT,
                f"{cls.name} holds sites whose catalog managers differ ({first}, {second}); one member "
                "cannot serve both",
            )
        for stray in analysis.strays:
            if stray.duplicated:
                yield parsed.finding(
                    stray.node, codes.DUPLICATED_PLACEHOLDER,
                    f"duplicated placeholder `{stray.name}`: its site already has one; remove this one",
                )
            else:
                yield parsed.finding(
                    stray.node, codes.STRAY_PLACEHOLDER,
                    f"stray placeholder `{stray.name}` outside every catalogued site; remove it, or add its "
                    "site to the catalog",
                )
        for uncovered in analysis.uncovered:
            yield parsed.finding(
                uncovered.call, codes.UNCOVERED_FORWARD,
                f"uncovered forward path: {uncovered.what} `{uncovered.name}(...)` in {uncovered.class_name}, "
                "a class no catalogued site covers; add a site for it to the catalog",
            )
