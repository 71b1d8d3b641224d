"""Finding records and their codes, shared by check and the transforms (each rule's documentation is in its
module under rewrite/rules/; docs/cli.md's table is generated from them and from `BAD_INPUT_DOCS`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Findings (exit 1).
MISSING_PLACEHOLDER = "CI101"
SITE_NOT_FOUND = "CI102"
STRAY_PLACEHOLDER = "CI103"
DUPLICATED_PLACEHOLDER = "CI104"
INCOMPLETE_PLACEHOLDER = "CI105"
HAND_WRITTEN = "CI106"
UNKNOWN_HAND_WIRING = "CI107"
AMBIGUOUS_ROLE = "CI108"
UNWIRED_SITE = "CI201"
HOOK_MISSING = "CI202"
HOOK_WITHOUT_WIRING = "CI203"
MEMBER_MISMATCH = "CI204"
STALE_WIRING = "CI205"
MANAGER_CONFLICT = "CI206"
UNDEFINED_IN_WIRING = "CI207"
UNREACHABLE_MANAGER = "CI208"
HOOK_NOT_PLACED = "CI209"
UNCOVERED_FORWARD = "CI301"
UNUSED_NOQA = "CI401"

# Bad input (exit 2); CI901-CI905 come from rewrite/io/files.py.
SYNTAX_ERROR = "CI910"
NOT_ROUND_TRIPPABLE = "CI911"
NOT_A_NO_OP = "CI912"
INTERNAL_ERROR = "CI919"

# The bad-input codes' rows of docs/cli.md's finding-code table (the rules' rows come from their modules).
BAD_INPUT_DOCS = (
    ("CI901", "unreadable: missing, permission denied, a directory, a broken link", ""),
    ("CI902", "binary file (NUL byte) named `.py`", ""),
    ("CI903", "bytes not valid in the file's encoding, or a bad coding cookie", ""),
    ("CI904", "symbolic link loop", ""),
    ("CI905", "the atomic write failed; the original is untouched", ""),
    (SYNTAX_ERROR, "syntax error", ""),
    (NOT_ROUND_TRIPPABLE, "libcst cannot reproduce the file byte for byte (`check` detects the known case, a form "
     "feed in indentation, by a byte scan)", ""),
    (NOT_A_NO_OP, "scaffold's output minus its placeholders is not AST-identical to the input; nothing written",
     "report it"),
    (INTERNAL_ERROR, "internal error on this file; nothing written", "report it"),
)


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int  # 1-based
    col: int  # 1-based, in characters
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"

    def as_dict(self) -> dict:
        return {
            "path": str(self.path),
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
        }
