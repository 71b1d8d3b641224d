"""The run of a transform over a tree: discover the files, keep the candidates, parse and analyse each,
plan its edits (the transform's planner), apply them with libcst, verify, and write atomically.

A transform's candidate is a file whose path matches a catalog location or whose bytes hold a
placeholder name (`prefilter.SITES`); nothing else is read past that byte scan. `check` has its own
pass (`scan.Scan`), which also follows forward paths between files and keeps a cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.locate import analyse
from canary_instrument.rewrite.analysis.modules import module_files
from canary_instrument.rewrite.analysis.tree import FileChange, ParsedFile, RunResult, parse_source, split_lines
from canary_instrument.rewrite.findings import INTERNAL_ERROR, NOT_ROUND_TRIPPABLE
from canary_instrument.rewrite.io.files import SourceError, SourceFile, iter_python_files, read_source, write_atomic
from canary_instrument.rewrite.io.prefilter import SITES, Prefilter


def discover(paths: Iterable, catalog: Catalog) -> Iterable[Path | SourceError]:
    return iter_python_files([Path(p) for p in paths], exclude=catalog.exclude)


def candidates(paths: Iterable, catalog: Catalog, result: RunResult, others: list[Path] | None = None):
    """Yield the paths of the files that may hold sites, hooks or placeholders; count every file,
    record discovery errors (`others`: gets the files not yielded)."""
    prefilter = Prefilter(catalog)
    for item in discover(paths, catalog):
        if isinstance(item, SourceError):
            result.errors.append(item)
            continue
        result.files_seen += 1
        if prefilter.path_matches(item.as_posix()):
            yield item
            continue
        try:
            with open(item, "rb") as handle:
                data = handle.read()
        except OSError:
            yield item  # read_source reports why
            continue
        if prefilter.needs(item.as_posix(), data) & SITES:
            yield item
        elif others is not None:
            others.append(item)


def load(path: Path, catalog: Catalog) -> ParsedFile:
    source = read_source(path)
    tree = parse_source(source)
    lines = split_lines(source.text)
    return ParsedFile(source, tree, lines, analyse(path, tree, catalog, lines))


def parse_cst(source: SourceFile):
    """The libcst module of a file, refusing a file libcst cannot reproduce byte for byte."""
    import libcst as cst  # only the transforms pay for libcst's import

    try:
        module = cst.parse_module(source.text)
    except cst.ParserSyntaxError as error:
        raise SourceError(
            source.path, error.raw_line, error.raw_column + 1, NOT_ROUND_TRIPPABLE,
            f"libcst cannot parse this file: {error.message}",
        ) from None
    if module.code != source.text:
        old, new = source.text.splitlines(keepends=True), module.code.splitlines(keepends=True)
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new))) + 1
        raise SourceError(
            source.path, line, 1, NOT_ROUND_TRIPPABLE,
            "libcst does not reproduce this file byte for byte; it is left untouched",
        )
    return module


Planner = Callable[[ParsedFile, Catalog, RunResult], "object | None"]


def run_transform(
    paths: Iterable,
    catalog: Catalog,
    planner: Planner,
    *,
    write: bool,
    verify: Callable[[ParsedFile, str], None] | None = None,
) -> RunResult:
    """Plan each candidate file, apply the plan with libcst, verify, and write (atomically) if asked."""
    result = RunResult(written=write)
    others: list[Path] = []
    handed: set[str] = set()
    for path in candidates(paths, catalog, result, others):
        _run_file(path, catalog, planner, write, verify, result, handed)
    # Files a model runner hands itself to for graph capture hold its after-capture hooks: read them too.
    while handed:
        found = module_files(handed, others)
        handed = set()
        others = [path for path in others if path not in found]
        for path in found:
            _run_file(path, catalog, planner, write, verify, result, handed)
    result.findings.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return result


def _run_file(path: Path, catalog: Catalog, planner: Planner, write: bool, verify, result: RunResult,
              handed: set[str]) -> None:
    """Plan one file and apply its plan; `handed` gets the modules its model runner hands capture to."""
    from canary_instrument.rewrite.transforms.plan import PlanNotApplied  # the transforms' module: check never needs it

    try:
        parsed = load(path, catalog)
        result.files_analysed += 1
        handed |= parsed.analysis.handed
        plan = planner(parsed, catalog, result)
        if not plan:
            return
        from canary_instrument.rewrite.transforms.edits import apply_plan  # libcst: only when there is work

        module = parse_cst(parsed.source)
        new_text = apply_plan(module, plan).code
        if new_text == parsed.source.text:
            return
        if verify is not None:
            verify(parsed, new_text)
        new = parsed.source.encode(new_text)
        change = FileChange(path, parsed.source.data, new, parsed.source.encoding, plan.touched)
        if write:
            write_atomic(path, new)
        result.changes.append(change)
    except SourceError as error:
        result.errors.append(error)
    except PlanNotApplied as error:
        result.errors.append(SourceError(path, 1, 1, INTERNAL_ERROR, f"internal error, nothing written: {error}"))
