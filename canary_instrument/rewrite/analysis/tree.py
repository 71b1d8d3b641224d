"""Walk a target tree once: discover files, keep the candidates, parse and analyse them, and run a transform.

A transform's candidate is a file whose path matches a catalog location or whose bytes hold a
placeholder name (`prefilter.SITES`); nothing else is read past that byte scan. `check` has its own
walk (`check.check_tree`), which also follows forward paths between files and keeps a cache.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.analysis.locate import FileAnalysis, analyse
from canary_instrument.rewrite.analysis.modules import module_files
from canary_instrument.rewrite.findings import INTERNAL_ERROR, NOT_ROUND_TRIPPABLE, SYNTAX_ERROR, Finding
from canary_instrument.rewrite.io.files import SourceError, SourceFile, iter_python_files, read_source, write_atomic
from canary_instrument.rewrite.io.prefilter import SITES, Prefilter
from canary_instrument.rewrite.syntax.nodes import char_column


@dataclass
class ParsedFile:
    source: SourceFile
    tree: ast.Module
    lines: list[str]
    analysis: FileAnalysis

    @property
    def path(self) -> Path:
        return self.source.path

    def position(self, node: ast.AST) -> tuple[int, int]:
        """1-based line and character column of an ast node."""
        line = self.lines[node.lineno - 1] if node.lineno - 1 < len(self.lines) else ""
        return node.lineno, char_column(line, node.col_offset)

    def finding(self, node: ast.AST | None, code: str, message: str) -> Finding:
        line, col = self.position(node) if node is not None else (1, 1)
        return Finding(self.path, line, col, code, message)


@dataclass
class FileChange:
    path: Path
    old: bytes
    new: bytes
    encoding: str
    sites: int = 0  # sites (and hooks) this change touches

    def diff(self) -> str:
        old = self.old.decode(self.encoding).splitlines(keepends=True)
        new = self.new.decode(self.encoding).splitlines(keepends=True)
        import difflib  # here, not at the top: check, a pre-commit gate, never prints a diff

        return "".join(difflib.unified_diff(old, new, f"a/{self.path}", f"b/{self.path}"))


@dataclass
class RunResult:
    """What a command found and changed; the CLI prints it, tests assert on it."""

    findings: list[Finding] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    changes: list[FileChange] = field(default_factory=list)
    files_seen: int = 0
    files_analysed: int = 0
    written: bool = False

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


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


def parse_source(source: SourceFile) -> ast.Module:
    try:
        return ast.parse(source.text, filename=str(source.path))
    except SyntaxError as error:
        line = error.lineno or 1
        col = error.offset or 1
        raise SourceError(source.path, line, col, SYNTAX_ERROR, f"syntax error: {error.msg}; fix it and re-run") from None
    except ValueError as error:  # e.g. source with NUL-like problems the decoder let through
        raise SourceError(source.path, 1, 1, SYNTAX_ERROR, f"cannot parse: {error}") from None


_NEWLINES = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list[str]:
    """Lines as the Python tokenizer counts them (str.splitlines also splits at form feeds)."""
    return _NEWLINES.split(text) if "\r" in text else text.split("\n")  # the same, the second far cheaper


def load(path: Path, catalog: Catalog) -> ParsedFile:
    source = read_source(path)
    tree = parse_source(source)
    lines = split_lines(source.text)
    return ParsedFile(source, tree, lines, analyse(path, tree, catalog, lines))


_FORM_FEED_INDENT = re.compile(r"^[ \t]*\x0c", re.MULTILINE)


def screen_round_trip(parsed: ParsedFile) -> None:
    """Raise for what libcst is known to drop (a form feed in indentation), without importing libcst.

    `check` runs this on site files so that the gate fails on a file `apply` would refuse.
    """
    match = _FORM_FEED_INDENT.search(parsed.source.text)
    if match is not None:
        line = len(split_lines(parsed.source.text[: match.start()]))
        raise SourceError(
            parsed.path, line, match.end() - match.start(), NOT_ROUND_TRIPPABLE,
            "libcst drops a form feed in indentation, so this file cannot be rewritten exactly; remove the form feed",
        )


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
