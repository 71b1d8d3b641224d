"""check's pass over the tree's files: what each needs, its report, and the files CI301's caller search brings in.

Files the cache vouches for are not read again; on a large tree the reading is shared with a forked
child (`parallel.Pair`). The rules are not applied here: `report_of` (check's) turns a parsed file
into its `FileReport`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.io.cache import CheckCache, content_hash
from canary_instrument.rewrite.analysis.callgraph import CallGraph
from canary_instrument.rewrite.io.files import SourceError, decode_source, read_bytes, read_source
from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.analysis.locate import analyse
from canary_instrument.rewrite.analysis.modules import ModuleIndex
from canary_instrument.rewrite.io.parallel import Pair, split
from canary_instrument.rewrite.analysis.placement import Placement
from canary_instrument.rewrite.io.callers import CallerSearch, defines_class
from canary_instrument.rewrite.io.prefilter import REACH, ROLES, SITES, Prefilter
from canary_instrument.rewrite.io.search_memo import SearchMemo
from canary_instrument.rewrite.analysis.reach import reach_facts, site_spans
from canary_instrument.rewrite.report import FileReport
from canary_instrument.rewrite.suppressions import noqa_directives
from canary_instrument.rewrite.analysis.tree import ParsedFile, RunResult, parse_source, screen_round_trip, split_lines
from canary_instrument.rewrite.uncovered import callers_wanted, uncovered_findings

ReportOf = Callable[[ParsedFile, Catalog], FileReport]

# cache.extra (hashes of files' paths and content hashes):
EXPANSION = "expansion"  # (candidate files, what the caller search looked for, the files it found)
UNCOVERED = "uncovered"  # (every analysed file, CI301's findings)
RESULT = "result"  # (every file, findings, file errors, files analysed)
# How much more a byte of a file at a catalog location costs than a byte only read and scanned (the
# ratio measured on the development releases; it only orders the work between the two processes).
ANALYSED_WEIGHT = 100


class Scan:
    """One pass over the tree's files: what each needs, its report, and the callers CI301 needs.

    On a large tree the files are shared between this process and a forked child (`parallel.Pair`),
    which keeps the bytes of the files it read: the caller search runs on each side over those.
    """

    def __init__(self, catalog: Catalog, result: RunResult, cache: CheckCache | None, report_of: ReportOf,
                 keep_trees: bool = False) -> None:
        self.catalog = catalog
        self.report_of = report_of  # a parsed file's report: the rules, applied by check
        self.result = result
        self.cache = cache if cache is not None and cache.enabled else None
        self.reports: dict[str, FileReport | None] = {}  # analysed files (None: an error, reported)
        self.needs: dict[str, int] = {}
        self.seen: dict[str, bytes] = {}  # every file -> its content hash
        self.others: list[tuple[str, os.stat_result]] = []  # files nothing needed (yet)
        self.data: dict[str, bytes] = {}  # bytes of those, while this run has them
        self.kept: dict[str, FileReport] = {}  # reports of such files a caller search found last time
        self.errors: list[SourceError] = []  # files that could not be analysed
        self.memo: tuple | None = None  # the cache's outcome, when no file changed since
        self.changed: set[str] = set()  # files whose content is not what the cache knew
        self._fingerprint: bytes | None = None
        self.graph: CallGraph | None = None  # the call graph of all analysed files, once expand built it
        self.pair = Pair({}, 0)  # this process and, once `files` forks one, the child that read half the tree
        self.side: dict[str, int] = {}  # the side of the pair that read each file this run (0: this process)
        self._searches: dict[int, CallerSearch] = {}  # each side's caller search over its files
        self._modules: ModuleIndex | None = None  # the files no rule needed, by module (`_imported`)
        # With `keep_trees` (check_tree's `keep_work`), the syntax trees and lines of the files analysed
        # are freed with the scan, not as each file is done.
        self._parsed: list | None = [] if keep_trees else None

    @cached_property
    def prefilter(self) -> Prefilter:
        return Prefilter(self.catalog)  # its regexes cost more than a warm run's other work

    def files(self, files: list[tuple[str, os.stat_result | None]]) -> None:
        """Examine every file (on two cores when many must be read) and record the outcomes in order."""
        cached = [self.cache.lookup(path, st) if self.cache is not None else None for path, st in files]
        todo = [i for i, entry in enumerate(cached) if entry is None]
        # Work costs by size, and per byte a file at a catalog location (parsed and analysed) costs
        # ANALYSED_WEIGHT times one that is only read and scanned. The weights order the work, the
        # heaviest first, so that the two processes sharing it end together.
        weights = [
            (files[i][1].st_size if files[i][1] is not None else 0) * (ANALYSED_WEIGHT if self.prefilter.path_matches(
                files[i][0] if os.sep == "/" else Path(files[i][0]).as_posix()) else 1)
            for i in todo
        ]
        if not todo and self.cache is not None:
            self.seen = {path: entry[3] for (path, _), entry in zip(files, cached)}
            memo = self.cache.extra.get(RESULT)
            if memo is not None and memo[0] == self.fingerprint():
                self.memo = memo
                return
        # Fork when there are enough bytes to read that a second process pays for itself.
        size = sum(files[i][1].st_size for i in todo if files[i][1] is not None)
        self.pair = Pair({
            "examine": lambda i: self.examine(*files[i]), "find": self._find_side,
            "handed": lambda key: self.analyse(Path(key), self.data.get(key), SITES | REACH),
        }, size)
        outcomes, sides = self.pair.map("examine", todo, weights)
        for i, outcome, side in zip(todo, outcomes, sides):
            cached[i] = outcome
            if side:
                self.side[files[i][0]] = side
        for (path, st), entry in zip(files, cached):
            self.record(path, st, entry)

    def close(self, wait: bool = True) -> None:
        """End the pair's child (`wait=False`: let it end while the findings are joined, `Pair.close`), and
        once reaped the pair's hold on this scan: its functions refer back to it, a cycle that (with the
        collector off during a check) would keep every report alive until the interpreter's exit
        collects it, at a cost that grows with the tree."""
        self.pair.close(wait)
        if wait:
            self.pair.functions = {}

    def handed_off(self) -> None:
        """Analyse the files a model runner hands itself to for graph capture, as apply does: wherever they
        are, they hold its after-capture hooks."""
        handed = set().union(*(r.handed for r in self.reports.values() if r is not None))
        while handed:
            found = ModuleIndex([key for key, _ in self.others]).files(handed)
            handed = set()
            sizes = {key: st.st_size if st is not None else 0 for key, st in self.others}
            taken = set(found)
            self.others = [(key, st) for key, st in self.others if key not in taken]
            reports, _ = self.pair.map("handed", found, [sizes[key] for key in found])  # on both sides
            for key, report in zip(found, reports):
                self.needs[key] = SITES | REACH
                if isinstance(report, SourceError):
                    self.errors.append(report)
                    self.reports[key] = None
                else:
                    self.reports[key] = report
                    handed |= report.handed

    def fingerprint(self) -> bytes | None:
        """A hash of every file's path and content hash (with a cache): equal means nothing changed."""
        if self._fingerprint is None and self.cache is not None:
            self._fingerprint = self._digest(self.seen)
        return self._fingerprint

    def _digest(self, keys) -> bytes:
        return content_hash(b"".join(k.encode() + b"\0" + self.seen.get(k, b"") for k in sorted(keys)))

    def examine(self, key: str, st) -> tuple:
        """(size, mtime, inode, hash, needs, payload) of a file the cache's stat does not vouch for."""
        try:
            data = read_bytes(key, st)
        except OSError:
            return (None, None, None, b"", SITES | REACH, self.analyse(Path(key), None, SITES | REACH))
        digest = content_hash(data) if self.cache is not None else b""
        entry = self.cache.lookup_hash(key, digest) if self.cache is not None else None
        if entry is not None:
            return ("same", None, None, digest, entry[4], entry[5])  # touched, not changed
        # A Path only for the few files analysed: building one per file of the tree costs more than its byte scan.
        needs = self.prefilter.needs(key if os.sep == "/" else Path(key).as_posix(), data)
        if not needs:
            self.data[key] = data  # for the caller search (in a forked child, simply dropped)
        return (None, None, None, digest, needs, self.analyse(Path(key), data, needs) if needs else None)

    def record(self, key: str, st, entry: tuple) -> None:
        digest, needs, payload = entry[3], entry[4], entry[5]
        if entry[0] is None:
            self.changed.add(key)
        if self.cache is not None and st is not None and entry[0] in (None, "same") and digest:
            self.cache.store(key, st, digest, needs, payload)
        self.seen[key] = digest
        self.needs[key] = needs
        if needs:
            payload = CheckCache.payload(payload)
        if isinstance(payload, SourceError):
            self.errors.append(payload)
            self.reports[key] = None
        elif needs:
            self.reports[key] = payload
        else:
            self.others.append((key, st))
            if payload is not None:
                self.kept[key] = payload

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
            if self._parsed is not None:
                self._parsed.append((tree, lines))  # see __init__
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
        return Placement(path, self._roles(path)) if needs & ROLES else None

    def _roles(self, path: Path) -> set[str]:
        """The roles with a candidate location at this path (what locate reports as expected there)."""
        posix = path.as_posix()
        return {entry.role for entry, location in self.catalog.locations() if location.matches_path(posix)}

    def _bytes(self, key: str) -> bytes:
        data = self.data.get(key)
        if data is None:
            try:
                with open(key, "rb") as handle:
                    data = self.data[key] = handle.read()
            except OSError:
                data = b""
        return data

    def uncovered(self, reports: dict[str, FileReport]) -> list[Finding]:
        """CI301's findings; those of the cache's run when no file changed since (the call graph is
        the largest part of a warm run)."""
        analysed = self._digest(self.reports) if self.cache is not None else None  # all CI301 reads
        memo = self.cache.extra.get(UNCOVERED) if self.cache is not None else None
        if memo is not None and memo[0] == analysed:
            return list(memo[1])
        files = [(r.path, r.reach) for r in reports.values() if r.reach is not None]
        graph = self.graph if self.graph is not None and len(self.graph.files) == len(files) else None
        found = uncovered_findings(files, self.catalog, graph)
        if self.cache is not None:
            self.cache.set_extra(UNCOVERED, (analysed, tuple(found)))
        return found

    def expand(self) -> None:
        """Bring in the files that may call a function on an uncovered forward path, until none is left.

        The call graph of the analysed files says which functions matter; a byte search of the other
        files finds their callers (`CallerSearch`). While the candidate files and the files that search
        found are those of the cache's run, so is the outcome, unless a changed file matches one of
        the names that run searched for: then only the changed files are read. Else a round that looks
        for what a round of the last search looked for reads only the files that search did not see
        (`SearchMemo`)."""
        if not self.catalog.triggers:
            return
        candidates = self._digest(k for k, n in self.needs.items() if n) if self.cache is not None else None
        searches = SearchMemo(self.cache, self.changed)  # the last search's hits per round
        memo = self.cache.extra.get(EXPANSION) if self.cache is not None else None
        if memo is not None and memo[0] == candidates and all(k in self.kept and k not in self.changed for k in memo[2]):
            changed = [key for key, _ in self.others if key in self.changed and key not in memo[2]]
            if not changed or not CallerSearch([self._bytes(key) for key in changed]).find(memo[1]):
                for key in memo[2]:
                    self.reports[key] = CheckCache.payload(self.kept[key])
                searches.age()
                return
        searched: set = set()
        found_keys: list[str] = []
        taken: set[str] = set()  # files a search round found (analysed, or not analysable)
        parts = None
        while True:
            # Each round's reports join the tree after the earlier ones: the graph takes them in.
            files = [(r.path, r.reach) for r in self.reports.values() if r is not None and r.reach]
            if self.graph is None:
                self.graph = CallGraph(files)
            else:
                self.graph.add(files[len(self.graph.files):])
            graph = self.graph
            wanted = callers_wanted(graph) - searched
            if not wanted or not self.others:
                break
            searched |= wanted
            if parts is None:
                parts = self._parts()
                position = {key: index for index, (key, _) in enumerate(self.others)}
                stats = dict(self.others)
                unvouched = searches.fresh(list(stats))  # files the last search's hits say nothing of
            # A class wanted for its definition is looked for where the code imports it from; only one
            # not defined there is searched for in every file.
            imported = self._imported(wanted, stats)
            search = {entry for entry in wanted if entry[0] != "define" or entry[1] not in imported}
            # Each side searches the files whose bytes it holds and analyses those its search finds;
            # the files the code imports a wanted class from, known before the search, are analysed
            # meanwhile, split by size between the sides. Reports join the tree in the order of the
            # files, as one search over all of them would give.
            given = sorted({key for keys in imported.values() for key in keys if key not in taken},
                           key=position.__getitem__)
            skip = set(given) | self.kept.keys()  # analysed by the side given it, or the cache's report kept
            fresh = [key for key in given if key not in self.kept]
            entries = frozenset(search)
            reused = searches.hits(entries)
            if reused is not None:  # a round of the last search: only the files it did not see are read
                new, here = self._find_side(2, unvouched, search, taken, skip, fresh)
                here += self._reports_of(sorted(reused, key=position.__getitem__), taken, skip, [])
                there, known = [], reused.union(new)
            else:
                shares = split([stats[key].st_size if stats[key] else 0 for key in fresh]) if self.pair.forked else (
                    range(len(fresh)), ())
                calls = [(side, parts[side], search, taken, skip, [fresh[i] for i in shares[side]]) for side in (0, 1)]
                if self.pair.forked:
                    (mine, here), (theirs, there) = self.pair.both("find", calls[0], calls[1])
                else:
                    (mine, here), (theirs, there) = self._find_side(*calls[0]), self._find_side(*calls[1])
                known = {*mine, *theirs}
            searches.record(entries, known)
            reports = {key: report for key, report in here + there if report is None}
            reports.update((key, report) for key, report in here + there if report is not None)
            hits = sorted(reports.keys() | set(given), key=position.__getitem__)
            found = [(key, reports.get(key)) for key in hits]
            taken.update(hits)
            added = False
            for key, report in found:
                if report is None:
                    report = CheckCache.payload(self.kept[key])
                elif isinstance(report, SourceError):
                    continue  # found only by this search, not a candidate: its errors are not check's
                elif self.cache is not None and stats[key] is not None and key in self.seen:
                    self.cache.store(key, stats[key], self.seen[key], 0, report)
                self.reports[key] = report
                found_keys.append(key)
                added = True
            if not added:
                break  # the call graph just built is the tree's: all it wants was searched for
        searches.save(self.seen.keys() - stats.keys() if parts is not None else set())
        if self.cache is not None:
            self.cache.set_extra(EXPANSION, (candidates, frozenset(searched), frozenset(found_keys)))

    def _imported(self, wanted, stats: dict) -> dict[str, list[str]]:
        """For each ("define", class) of `wanted`, the files not analysed that define it in a module the
        code imports it from (("imported", class, module) entries); classes without one are left out."""
        modules: dict[str, set[str]] = {}
        for entry in wanted:
            if entry[0] == "imported":
                modules.setdefault(entry[2], set()).add(entry[1])
        if not modules:
            return {}
        index = self._modules = self._modules or ModuleIndex(list(stats))  # `stats`: the same files every round
        found: dict[str, list[str]] = {}
        for module, names in modules.items():
            for key in index.files([module]):
                for name in names:
                    if ("define", name) in wanted and defines_class(self._bytes(key), name):
                        found.setdefault(name, []).append(key)
        return found

    def _parts(self) -> tuple[list[str], list[str]]:
        """The files no rule needed, split by the side of the pair that holds their bytes; files read by
        neither (unchanged since the cache's run) go to the side with fewer bytes so far. Each round
        searches every byte of a side once per name, so the sides are then evened out: the side with
        more bytes hands its last files over (the other reads them once, then keeps them)."""
        parts: tuple[list[str], list[str]] = ([], [])
        totals = [0, 0]
        size = {key: st.st_size if st is not None else 0 for key, st in self.others}
        for key, _ in self.others:
            side = self.side.get(key)
            if side is None:
                side = 0 if totals[0] <= totals[1] or not self.pair.forked else 1
            parts[side].append(key)
            totals[side] += size[key]
        if self.pair.forked:
            heavy = 0 if totals[0] > totals[1] else 1
            while parts[heavy] and totals[heavy] - size[parts[heavy][-1]] >= totals[1 - heavy]:
                key = parts[heavy].pop()
                parts[1 - heavy].append(key)
                totals[heavy] -= size[key]
                totals[1 - heavy] += size[key]
        return parts

    def _find_side(self, side: int, keys: list[str], wanted, taken, skip, given) -> tuple[list[str], list]:
        """The files among `keys` (this side's files, the same every round; side 2: the files the last
        search did not see) that may call what `wanted` names, and (file, report) of those not `taken`
        (found by earlier rounds) and of the files `given` to analyse (`_reports_of`). Runs on either
        side of the pair: bytes in memory are only spared a read."""
        hits = []
        if keys:
            search = self._searches.get(side)
            if search is None:
                search = self._searches[side] = CallerSearch([self._bytes(key) for key in keys])
            hits = [keys[i] for i in sorted(search.find(wanted, two_cores=not self.pair.forked))]
        return hits, self._reports_of(hits, taken, skip, given)

    def _reports_of(self, hits: list[str], taken, skip, given) -> list[tuple[str, object]]:
        """(file, report) of the `hits` not `taken` and of the files `given`; a hit in `skip` (given to a
        side, or kept from the cache) is named without a report."""
        return [(key, None) if key in skip else (key, self._analyse_found(key)) for key in hits if key not in taken] + [
            (key, self._analyse_found(key)) for key in given]

    def _analyse_found(self, key: str) -> FileReport | SourceError:
        """The call-graph report of a file the caller search found (its bytes read again where this
        side does not hold them)."""
        return self.analyse(Path(key), self.data.get(key), REACH)

