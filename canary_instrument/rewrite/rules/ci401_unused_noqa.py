"""CI401 unused-noqa.

Reports: unused suppression: a `# noqa: CIxxx` directive whose code no finding on its line reports (ruff's RUF100)

Why: An acknowledgement that outlives the finding it was written for would silently hide the next finding of that
code on the line; a reviewed finding that went away should take its acknowledgement with it.

Fix: remove the code from the directive (or the directive)
"""

from __future__ import annotations

from pathlib import Path

from canary_instrument.rewrite.findings import UNUSED_NOQA, Finding

CODE = UNUSED_NOQA
# A whole-tree rule: rewrite/suppressions.py applies the directives to every finding of the run, then asks
# this module for the finding of each code of ours a directive names that silenced nothing.


def finding(path: Path, line: int, col: int, code: str) -> Finding:
    return Finding(
        path, line, col, CODE,
        f"unused suppression: `# noqa: {code}` silences no {code} finding on this line; remove it",
    )
