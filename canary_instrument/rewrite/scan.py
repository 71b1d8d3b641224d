"""check's pass over the tree's files: what each needs, its report, and the files CI301's caller search brings in.

One process, file after file. A file the cache vouches for is not read again: its reports are the
cache's. The rules are not applied here: `report_of` (check's) turns a parsed file into its `FileReport`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.callgraph import CallGraph
from canary_instrument.rewrite.analysis.locate import analyse
from canary_instrument.rewrite.analysis.modules import ModuleIndex
from canary_instrument.rewrite.analysis.placement import Placement
from canary_instrument.rewrite.analysis.reach import reach_facts, site_spans
from canary_instrument.rewrite.analysis.tree import ParsedFile, parse_source, screen_round_trip, split_lines
from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.io.cache import CheckCache, content_hash
from canary_instrument.rewrite.io.callers import CallerSearch, defines_class
from canary_instrument.rewrite.io.files import SourceError, decode_source, read_source
from canary_instrument.rewrite.io.prefilter import REACH, ROLES, SITES, Prefilter
from canary_instrument.rewrite.report import FileReport
from canary_instrument.rewrite.rules.ci301_uncovered_forward import callers_wanted, uncovered_findings
from canary_instrument.rewrite.suppressions import noqa_directives

ReportOf = Callable[[ParsedFile, Catalog], FileReport]


class Scan:
    """One pass over the tree's files: what each needs (`needs`), the reports of those analysed (`reports`,
    in the order they join the call graph; None for a file that could not be, reported in `errors`), and
    the call graph CI301's caller search built on the way (`graph`)."""

    def __init__(self, catalog: Catalog, cache: CheckCache | None, report_of: ReportOf) -> None:
        self.catalog = catalog
        self.cache = cache if cache is not None and cache.enabled else None
        self.report_of = report_of
        self.prefilter = Prefilter(catalog)
        self.reports: dict[str, FileReport | None] = {}
        self.needs: dict[str, int] = {}
        self.digests: dict[str, bytes] = {}  # every file's content hash (with a cache)
        self.errors: list[SourceError] = []
        self.others: list[str] = []  # files no rule needs, in order: the caller search's
        self.graph: CallGraph | None = None
        self.memo: tuple | None = None  # the cache's run's outcome, when no file changed since (`reuse`)
        self._stats: dict[str, os.stat_result | None] = {}
        self._data: dict[str, bytes] = {}  # bytes of the files no rule needs, once read

    def files(self, files: list[tuple[str, os.stat_result | None]]) -> None:
        """Examine every file: what it needs, and its report where it needs analysis."""
        for key, st in files:
            self._stats[key] = st
            needs = self._examine(key, st)
            if needs:
                self.needs[key] = needs
                self._add(key, self._report(key, needs))
            else:
                self.needs[key] = 0
                self.others.append(key)

    def reuse(self, files: list[tuple[str, os.stat_result | None]]) -> bool:
        """Whether the cache's run's outcome is this one's (`memo`): the cache vouches for every file by its
        stat alone (nothing read), and that run was made from the same files."""
        if self.cache is None:
            return False
        for key, st in files:
            entry = self.cache.get(key, st)
            if entry is None:
                return False
            self.digests[key] = entry.digest
        if self.cache.result is not None and self.cache.result[0] == self.fingerprint():
            self.memo = self.cache.result
        return self.memo is not None

    def fingerprint(self) -> bytes:
        """A hash of every file's path and content hash: equal means the same tree."""
        return content_hash(b"".join(k.encode() + b"\0" + self.digests[k] for k in sorted(self.digests)))

    def _examine(self, key: str, st) -> int:
        """What a file needs (`Prefilter.needs`), from the cache where it vouches for the file."""
        entry = self.cache.get(key, st) if self.cache is not None else None
        if entry is not None:
            self.digests[key] = entry.digest
            return entry.needs
        try:
            data = Path(key).read_bytes()
        except OSError:
            return SITES | REACH  # analysed, so that reading it again reports why it cannot be
        if self.cache is not None:
            digest = self.digests[key] = content_hash(data)
            entry = self.cache.get(key, st, digest)
            if entry is not None:  # touched, not changed
                self.cache.put(key, st, digest, entry.needs, entry.reports)
                return entry.needs
        needs = self.prefilter.needs(key if os.sep == "/" else Path(key).as_posix(), data)
        if self.cache is not None:
            self.cache.put(key, st, digest, needs, {})
        self._data[key] = data
        return needs

    def _add(self, key: str, report: FileReport | SourceError) -> None:
        if isinstance(report, SourceError):
            self.errors.append(report)
            self.reports[key] = None
        else:
            self.reports[key] = report

    def _report(self, key: str, needs: int) -> FileReport | SourceError:
        """The file's report for `needs`: the cache's, else its analysis (then kept in the cache)."""
        entry = self.cache.entries.get(key) if self.cache is not None and key in self.digests else None
        if entry is not None and needs in entry.reports:
            return entry.reports[needs]
        report = self.analyse(Path(key), self._data.pop(key, None), needs)
        if entry is not None and self._stats.get(key) is not None:
            self.cache.put(key, self._stats[key], entry.digest, entry.needs, {**entry.reports, needs: report})
        return report

    def analyse(self, path: Path, data: bytes | None, needs: int) -> FileReport | SourceError:
        try:
            # A file at a catalog location is always read and parsed, so that a bad one is reported
            # (exit 2) even when it holds nothing the rules look at.
            source = read_source(path) if data is None else decode_source(path, data)
            tree = parse_source(source)
            suppressions = noqa_directives(source.text)
            if not needs & SITES and not (needs & REACH and self.catalog.triggers):
                return FileReport(path=path, placement=self._placement(path, needs), suppressions=suppressions)
            lines = split_lines(source.text)
            spans = []
            if needs & SITES:
                parsed = ParsedFile(source, tree, lines, analyse(path, tree, self.catalog, lines))
                if parsed.analysis.sites or parsed.analysis.hooks:
                    screen_round_trip(parsed)
                report = self.report_of(parsed, self.catalog)
                spans = site_spans(parsed.analysis)
            else:
                report = FileReport(path=path, placement=self._placement(path, needs))
            if needs & REACH and self.catalog.triggers:
                report.reach = reach_facts(path, tree, lines, spans, self.catalog)
            report.suppressions = suppressions
            return report
        except SourceError as error:
            return error

    def _placement(self, path: Path, needs: int) -> Placement | None:
        """A file at a catalog location that check does not analyse: the roles expected there."""
        if not needs & ROLES:
            return None
        posix = path.as_posix()
        return Placement(path, {entry.role for entry, location in self.catalog.locations()
                                if location.matches_path(posix)})

    def _bytes(self, key: str) -> bytes:
        data = self._data.get(key)
        if data is None:
            try:
                data = self._data[key] = Path(key).read_bytes()
            except OSError:
                data = b""
        return data

    def uncovered(self, reports: dict[str, FileReport]) -> list[Finding]:
        """CI301's findings over the analysed files (on the call graph `expand` built, when it holds them all)."""
        files = self._reach_files(reports)
        graph = self.graph if self.graph is not None and len(self.graph.files) == len(files) else None
        return uncovered_findings(files, self.catalog, graph)

    def call_graph(self) -> CallGraph | None:
        """The call graph of every analysed file (the one `expand` built, when it holds them all); None
        when no file is in it."""
        files = self._reach_files({k: r for k, r in self.reports.items() if r is not None})
        if self.graph is not None and len(self.graph.files) == len(files):
            return self.graph
        return CallGraph(files) if files else None

    @staticmethod
    def _reach_files(reports: dict[str, FileReport]) -> list:
        return [(r.path, r.reach) for r in reports.values() if r.reach is not None]

    def handed_off(self) -> None:
        """Analyse the files a model runner hands itself to for graph capture, as apply does: wherever they
        are, they hold its after-capture hooks."""
        handed = set().union(*(r.handed for r in self.reports.values() if r is not None))
        while handed:
            found = ModuleIndex(self.others).files(handed)
            taken = set(found)
            self.others = [key for key in self.others if key not in taken]
            handed = set()
            for key in found:
                self.needs[key] = SITES | REACH
                self._add(key, self._report(key, SITES | REACH))
                if self.reports[key] is not None:
                    handed |= self.reports[key].handed

    def expand(self) -> None:
        """Bring in the files that may call a function on an uncovered forward path, until none is left.

        The call graph of the analysed files says which functions matter (`callers_wanted`); a byte search
        of the other files finds their callers (`CallerSearch`); each round's files join the graph in the
        order of the files, and the next round asks what the grown graph wants."""
        if not self.catalog.triggers:
            return
        position = {key: index for index, key in enumerate(self.others)}
        searched: set = set()
        taken: set[str] = set()
        search = modules = None
        while True:
            files = [(r.path, r.reach) for r in self.reports.values() if r is not None and r.reach]
            if self.graph is None:
                self.graph = CallGraph(files)
            else:
                self.graph.add(files[len(self.graph.files):])
            wanted = callers_wanted(self.graph) - searched
            if not wanted or not self.others:
                return
            searched |= wanted
            # A class wanted for its definition is looked for where the code imports it from; only one
            # not defined there is searched for in every file.
            modules = modules or ModuleIndex(self.others)
            imported = self._imported(wanted, modules)
            search = search or CallerSearch([self._bytes(key) for key in self.others])
            hits = {self.others[i] for i in search.find(
                {entry for entry in wanted if entry[0] != "define" or entry[1] not in imported})}
            hits.update(key for keys in imported.values() for key in keys)
            added = False
            for key in sorted(hits - taken, key=position.__getitem__):
                taken.add(key)
                report = self._report(key, REACH)
                if not isinstance(report, SourceError):  # found only by this search: its errors are not check's
                    self.reports[key] = report
                    added = True
            if not added:
                return  # the call graph just built is the tree's: all it wants was searched for

    def _imported(self, wanted, modules: ModuleIndex) -> dict[str, list[str]]:
        """For each ("define", class) of `wanted`, the files not analysed that define it in a module the
        code imports it from (("imported", class, module) entries); classes without one are left out."""
        names_by_module: dict[str, set[str]] = {}
        for entry in wanted:
            if entry[0] == "imported":
                names_by_module.setdefault(entry[2], set()).add(entry[1])
        found: dict[str, list[str]] = {}
        for module, names in names_by_module.items():
            for key in modules.files([module]):
                for name in names:
                    if ("define", name) in wanted and defines_class(self._bytes(key), name):
                        found.setdefault(name, []).append(key)
        return found
