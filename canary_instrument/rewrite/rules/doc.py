"""docs/cli.md's finding-code table, generated from the rules' docstrings and the bad-input codes.

A rule's docstring holds paragraphs labelled `Reports:` (the table's meaning), `Why:` and `Fix:`
(what to do). `python -m canary_instrument.rewrite.rules.doc [DOCS]` rewrites the table in place;
with `--check` it only exits 1 when the table differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from canary_instrument.rewrite.findings import BAD_INPUT_DOCS
from canary_instrument.rewrite.rules import RULES

HEADER = "| code | exit | meaning | what to do |\n|---|---|---|---|\n"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def sections(doc: str) -> dict[str, str]:
    """A rule docstring's labelled paragraphs, each joined into one line."""
    found = {}
    for paragraph in doc.strip().split("\n\n"):
        label, sep, text = paragraph.partition(": ")
        if sep and label in ("Reports", "Why", "Fix"):
            found[label] = " ".join(text.split("\n"))
    return found


def table() -> str:
    """The finding-code table: every rule in code order (exit 1), then the bad-input codes (exit 2)."""
    rows = []
    for rule in RULES:
        doc = sections(rule.__doc__)
        rows.append(f"| `{rule.CODE}` | 1 | {doc['Reports']} | {doc['Fix']} |")
    for code, meaning, fix in BAD_INPUT_DOCS:
        rows.append(f"| `{code}` | 2 | {meaning} | {fix} |" if fix else f"| `{code}` | 2 | {meaning} | |")
    return HEADER + "\n".join(rows) + "\n"


def replace_table(text: str) -> str:
    """`text` (docs/cli.md) with its finding-code table replaced by the generated one."""
    start = text.index(HEADER)
    end = text.index("\n\n", start) + 1
    return text[:start] + table() + text[end:]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [arg for arg in argv if arg != "--check"]
    path = Path(paths[0]) if paths else DOCS
    text = path.read_text(encoding="utf-8")
    new = replace_table(text)
    if new == text:
        return 0
    if check:
        print(f"{path}: the finding-code table differs from the rules' docs; run "
              "`python -m canary_instrument.rewrite.rules.doc`", file=sys.stderr)
        return 1
    path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
