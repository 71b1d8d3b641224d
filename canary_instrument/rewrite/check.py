"""check: the pre-commit gate. Every site holds a placeholder or its wiring, nothing stray, nothing half-wired,
no forward path in a class that no site covers. Standard library only (no libcst), candidate files only.

Work is split in two: `file_report` turns one parsed file into a picklable `FileReport` (no AST
objects, so a cache can keep it), and `tree_findings` applies the rules that need the whole tree
(wiring is all-or-nothing across files) to the reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite import findings as codes
from canary_instrument.rewrite.files import SourceError
from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.tree import ParsedFile, RunResult, candidates, load, screen_round_trip


@dataclass
class FileReport:
    """What check needs to know about one file, as plain data."""

    path: Path
    findings: list[Finding] = field(default_factory=list)  # hold whatever the rest of the tree is
    when_wired: list[Finding] = field(default_factory=list)  # hold only if some site in the tree is wired
    when_unwired: list[Finding] = field(default_factory=list)  # hold only if no site in the tree is wired
    wired: bool = False  # a site in this file holds generated wiring
    roles_expected: set[str] = field(default_factory=set)  # roles with a candidate location at this path
    roles_located: set[str] = field(default_factory=set)  # roles whose site or hook is in this file


def check_tree(paths, catalog: Catalog) -> RunResult:
    result = RunResult()
    reports: list[FileReport] = []
    for path in candidates(paths, catalog, result):
        try:
            parsed = load(path, catalog)
            if parsed.analysis.sites or parsed.analysis.hooks:
                screen_round_trip(parsed)
            reports.append(file_report(parsed, catalog))
        except SourceError as error:
            result.errors.append(error)
    result.files_analysed = len(reports)
    result.findings.extend(tree_findings(reports))
    result.findings.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return result


def tree_findings(reports: list[FileReport]) -> list[Finding]:
    """The findings of a whole tree from its files' reports."""
    wired = any(report.wired for report in reports)
    located = set().union(*(report.roles_located for report in reports))
    out: list[Finding] = []
    reported_roles: set[str] = set()
    for report in reports:
        for role in sorted(report.roles_expected - located - reported_roles):
            reported_roles.add(role)
            out.append(Finding(
                report.path, 1, 1, codes.SITE_NOT_FOUND,
                f"{role}: this file matches the catalog's path but no candidate class, method and statement "
                "shape is in it; extend the catalog (--catalog or [tool.canary-instrument])",
            ))
        out.extend(report.findings)
        out.extend(report.when_wired if wired else report.when_unwired)
    return out


def file_report(parsed: ParsedFile, catalog: Catalog) -> FileReport:
    """Every finding one file contributes, the tree-dependent ones kept apart."""
    analysis = parsed.analysis
    report = FileReport(
        path=parsed.path,
        # Hand-written wiring is wiring too: a tree that holds it is not half-wired for lack of generated code.
        wired=any(m.state in ("wired", "handwritten") for m in analysis.sites),
        roles_expected=set(analysis.roles_expected),
        roles_located={m.site.role for m in analysis.sites} | {h.hook.role for h in analysis.hooks},
    )
    add, when_wired, when_unwired = report.findings.append, report.when_wired.append, report.when_unwired.append

    for match in analysis.sites:
        role, placeholder = match.site.role, match.placeholder
        where = match.where
        if match.state == "missing":
            add(parsed.finding(
                match.first, codes.MISSING_PLACEHOLDER,
                f"{role} site in {where} has no `{placeholder}` placeholder; run `canary-instrument scaffold`",
            ))
        elif match.state == "other":
            add(parsed.finding(
                match.anchor, codes.INCOMPLETE_PLACEHOLDER,
                f"{role} site in {where}: `{placeholder}` holds neither a placeholder nor generated wiring",
            ))
        elif match.state == "handwritten":
            add(parsed.finding(
                match.anchor, codes.HAND_WRITTEN,
                f"{role} site in {where}: `{placeholder}` holds hand-written canary wiring; "
                f"`canary-instrument apply` migrates it to `{placeholder} = {match.wiring()}`",
            ))
        elif match.state == "placeholder":
            when_wired(parsed.finding(
                match.anchor, codes.UNWIRED_SITE,
                f"half-wired: {role} site in {where} still holds a placeholder while the tree is wired; "
                "run `canary-instrument apply`",
            ))
        elif match.state == "wired" and not match.conforms():
            add(parsed.finding(
                match.anchor, codes.STALE_WIRING,
                f"{role} site in {where} is wired differently from the catalog ({match.wiring()}); "
                "run `canary-instrument apply`",
            ))

    for hook in analysis.hooks:
        role = hook.hook.role
        if not hook.present:
            when_wired(parsed.finding(
                hook.anchor, codes.HOOK_MISSING,
                f"half-wired: the {role} hook `{hook.statement}` is missing in {hook.where}; "
                "run `canary-instrument apply`",
            ))
            continue
        generated = [p for p in hook.present if p.handwritten is None]
        if generated:
            when_unwired(parsed.finding(
                generated[0].node, codes.HOOK_WITHOUT_WIRING,
                f"half-wired: the {role} hook is present but no site is wired; "
                "run `canary-instrument apply` (or `revert`)",
            ))
        for present in hook.present:
            if present.handwritten is not None:
                add(parsed.finding(
                    present.node, codes.HAND_WRITTEN,
                    f"{role} hook holds hand-written canary wiring; `canary-instrument apply` migrates it to "
                    f"`{present.migrated}`",
                ))
        for present in hook.present[1:]:
            add(parsed.finding(present.node, codes.DUPLICATED_PLACEHOLDER, f"duplicated {role} hook"))

    for info in analysis.members:
        class_wired = any(m.state == "wired" and m.class_node is info.class_node for m in analysis.sites)
        if class_wired and info.node is None:
            add(parsed.finding(
                info.class_node, codes.MEMBER_MISMATCH,
                f"half-wired: {info.class_node.name} has wired sites but no `{catalog.member}` member; "
                "run `canary-instrument apply`",
            ))
        elif info.node is not None and info.generated and not class_wired:
            add(parsed.finding(
                info.node, codes.MEMBER_MISMATCH,
                f"half-wired: generated `{catalog.member}` in {info.class_node.name} but none of its sites "
                "is wired; run `canary-instrument apply` (or `revert`)",
            ))
    for cls, first, second in analysis.manager_conflicts:
        add(parsed.finding(
            cls, codes.MANAGER_CONFLICT,
            f"{cls.name} holds sites whose catalog managers differ ({first}, {second}); one member "
            "cannot serve both",
        ))
    for problem in analysis.problems:
        name = problem.name
        if problem.kind == "duplicated":
            add(parsed.finding(
                problem.node, codes.DUPLICATED_PLACEHOLDER,
                f"duplicated placeholder `{name}`: its site already has one; remove this one",
            ))
        elif problem.kind == "incomplete":
            add(parsed.finding(
                problem.node, codes.INCOMPLETE_PLACEHOLDER, f"`{name}` is used but never assigned",
            ))
        elif problem.kind == "unknown":
            add(parsed.finding(
                problem.node, codes.UNKNOWN_HAND_WIRING,
                f"`{name}` holds hand-written canary wiring that no catalog role covers; to let the tool "
                f"manage it, add under [tool.canary-instrument]: {problem.detail}",
            ))
        elif problem.kind == "ambiguous":
            add(parsed.finding(
                problem.node, codes.AMBIGUOUS_ROLE,
                f"`{name}` fits the catalog roles {problem.detail} equally well; make one more specific "
                "(calls, requires, class_refs, loop) in the catalog",
            ))
        else:
            add(parsed.finding(
                problem.node, codes.STRAY_PLACEHOLDER,
                f"stray placeholder `{name}` ({problem.detail}); remove it, or add its site to the catalog",
            ))
    for uncovered in analysis.uncovered:
        add(parsed.finding(
            uncovered.call, codes.UNCOVERED_FORWARD,
            f"uncovered forward path: {uncovered.what} `{uncovered.name}(...)` in {uncovered.class_name}, "
            "a class no catalogued site covers; add a site for it to the catalog",
        ))
    return report

