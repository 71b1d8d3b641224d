"""Finding records and their codes, shared by check and the transforms (docs/cli.md lists every code)."""

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

# Bad input (exit 2); CI901-CI905 come from rewrite/io/files.py.
SYNTAX_ERROR = "CI910"
NOT_ROUND_TRIPPABLE = "CI911"
NOT_A_NO_OP = "CI912"
INTERNAL_ERROR = "CI919"

DESCRIPTIONS = {
    MISSING_PLACEHOLDER: "a catalogued site holds no placeholder",
    SITE_NOT_FOUND: "a catalogued file exists but none of its role's statement shapes is in it",
    STRAY_PLACEHOLDER: "a canary-named placeholder outside every catalogued site",
    DUPLICATED_PLACEHOLDER: "a second placeholder of the same role inside a site's method, or a duplicated hook",
    INCOMPLETE_PLACEHOLDER: "a placeholder used without its assignment, or assigned something neither "
    "a placeholder nor generated wiring",
    HAND_WRITTEN: "upstream's hand-written canary wiring at a site or hook; `apply` migrates it to generated wiring",
    UNKNOWN_HAND_WIRING: "hand-written canary wiring no catalog role covers (the message holds a catalog entry that would)",
    AMBIGUOUS_ROLE: "a site whose shape fits two catalog roles equally well",
    UNWIRED_SITE: "half-wired: the tree is wired but this site still holds a placeholder",
    HOOK_MISSING: "half-wired: the tree is wired but an install or init-finished hook is missing",
    HOOK_WITHOUT_WIRING: "half-wired: a hook is present but no site is wired",
    MEMBER_MISMATCH: "half-wired: a class with wired sites lacks the generated member, or has one it no longer uses",
    STALE_WIRING: "wiring differs from what the catalog generates",
    MANAGER_CONFLICT: "two sites in one class name different managers",
    UNDEFINED_IN_WIRING: "the catalog's wiring for a site reads a name its method does not define (apply skips it)",
    UNREACHABLE_MANAGER: "a class with sites holds nothing the catalog's manager expression reads, and no single "
    "model runner in its place (apply leaves its sites as they are)",
    HOOK_NOT_PLACED: "a hook the tree's wiring needs (install, init-finished) has no place in any file read",
    UNCOVERED_FORWARD: "a graph capture/replay or model-runner forward in a class no site covers",
    SYNTAX_ERROR: "the file does not parse",
    NOT_ROUND_TRIPPABLE: "libcst cannot reproduce the file byte for byte",
    INTERNAL_ERROR: "the tool failed on this file (a bug; nothing was written)",
    NOT_A_NO_OP: "scaffold's output minus its wrappers is not AST-identical to the input (nothing written)",
}


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
