"""One parsed file (`ParsedFile`: source, syntax tree, lines, analysis, positions) and what a command
found and changed (`RunResult`, `FileChange`): shared by check and the transforms (`transforms.runner`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.rewrite.analysis.locate import FileAnalysis
from canary_instrument.rewrite.findings import NOT_ROUND_TRIPPABLE, SYNTAX_ERROR, Finding
from canary_instrument.rewrite.io.files import SourceError, SourceFile
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


