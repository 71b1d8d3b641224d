"""check: the pre-commit gate. Every site holds a placeholder or its wiring, nothing stray, nothing half-wired,
no forward path that runs outside every catalogued site. Standard library only (no libcst), candidate files only.

The driver: `Scan` reads the tree and analyses the files the rules need; `file_report` applies the
per-file rules (`rules.FILE_CHECKS`) to one parsed file; the tree pass then applies the rules that
need the whole tree (wiring is all-or-nothing across files; CI102 and CI209 join every file's
placement; CI301 follows calls between files) to the reports.
"""

from __future__ import annotations

import os

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.io.cache import CheckCache
from canary_instrument.rewrite.io.files import SourceError, python_files
from canary_instrument.rewrite.findings import UNCOVERED_FORWARD, Finding
from canary_instrument.rewrite.analysis.placement import placement_of
from canary_instrument.rewrite.io.prefilter import ROLES, SITES
from canary_instrument.rewrite.report import FileReport
from canary_instrument.rewrite.rules import FILE_CHECKS, ci102_site_not_found
from canary_instrument.rewrite.scan import Scan
from canary_instrument.rewrite.suppressions import apply_suppressions
from canary_instrument.rewrite.analysis.tree import ParsedFile, RunResult


def check_tree(paths, catalog: Catalog, *, cache: CheckCache | None = None) -> RunResult:
    """Check the tree under `paths`. With a `cache`, files unchanged since its last run are not read again."""
    return _checked(paths, catalog, cache)[0]


def _checked(paths, catalog: Catalog, cache: CheckCache | None) -> tuple[RunResult, Scan]:
    result = RunResult()
    scan = Scan(catalog, cache, file_report)
    files = []
    for item, st in python_files([os.fspath(p) for p in paths], exclude=catalog.exclude):
        if isinstance(item, SourceError):
            result.errors.append(item)
        else:
            files.append((item, st))
    result.files_seen = len(files)
    if not scan.reuse(files):
        scan.files(files)
        scan.handed_off()
        scan.expand()
    _join(scan, result, catalog)
    if scan.cache is not None:
        scan.cache.retain(scan.digests.keys())
        scan.cache.write()
    return result, scan


def _join(scan: Scan, result: RunResult, catalog: Catalog) -> None:
    """The run's outcome from the scan's reports: the tree's findings, or the cache's run's outcome
    when no file changed since."""
    if scan.memo is not None:
        _, findings, errors, result.files_analysed = scan.memo
        result.errors.extend(errors)
        result.findings.extend(findings)
        return
    reports = {key: r for key, r in scan.reports.items() if r is not None}
    result.files_analysed = len(reports)
    considered = [r for key, r in reports.items() if scan.needs[key] & (SITES | ROLES)]
    found = tree_findings(considered, catalog) + scan.uncovered(reports)
    directives = {key: r.suppressions for key, r in reports.items() if r.suppressions}
    result.findings.extend(apply_suppressions(found, directives, catalog))
    result.errors.extend(scan.errors)
    if scan.cache is not None:
        scan.cache.set_result((scan.fingerprint(), tuple(result.findings), tuple(scan.errors), result.files_analysed))


def uncovered_forwards(paths, catalog: Catalog) -> list[Finding]:
    """CI301's findings on the tree under `paths`, as `check` reports them (what `apply` reports too)."""
    result = check_tree(paths, catalog)
    return [f for f in result.findings if f.code == UNCOVERED_FORWARD]


def uncovered_graph(paths, catalog: Catalog):
    """(the check's result, the call graph CI301 judged the tree by; None when the tree holds no trigger)."""
    result, scan = _checked(paths, catalog, None)
    return result, scan.call_graph()


def tree_findings(reports: list[FileReport], catalog: Catalog) -> list[Finding]:
    """The findings of a whole tree from its files' reports."""
    wired = any(report.wired for report in reports)
    out = ci102_site_not_found.tree_check([r.placement for r in reports if r.placement is not None], catalog)
    for report in reports:
        out.extend(report.findings)
        out.extend(report.when_wired if wired else report.when_unwired)
    return out


def file_report(parsed: ParsedFile, catalog: Catalog) -> FileReport:
    """Every finding one file contributes (the registered per-file rules), the tree-dependent ones kept apart."""
    analysis = parsed.analysis
    report = FileReport(
        path=parsed.path,
        # Hand-written wiring is wiring too: a tree that holds it is not half-wired for lack of generated code.
        wired=any(m.state in ("wired", "handwritten") for m in analysis.sites),
        placement=placement_of(parsed.path, analysis, catalog, parsed.position),
        handed=set(analysis.handed),
    )
    for rule in FILE_CHECKS:
        rule(parsed, catalog, report)
    return report
