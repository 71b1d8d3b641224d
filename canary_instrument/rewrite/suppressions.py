"""Findings a team has reviewed and acknowledged, the ruff way.

`# noqa: CI301` on the line a finding is reported at silences that code there (several codes: `# noqa:
CI301, CI106`); a bare `# noqa` silences every code on the line. `ignore` and `per-file-ignores` in
`[tool.canary-instrument]` (or a `--catalog` file) silence a code everywhere, or in the files whose path
ends with a pattern. A `# noqa` code of ours that silences nothing is itself reported (CI401, as ruff's
RUF100), so an acknowledgement does not outlive the finding it was written for. A bare `# noqa` may serve
other tools and is never reported.
"""

from __future__ import annotations

import re
from pathlib import Path

from canary_instrument.catalog import Catalog, path_matches
from canary_instrument.rewrite.analysis.tree import split_lines
from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.rules import ci401_unused_noqa

# flake8's and ruff's form: `# noqa`, or `# noqa:` and codes separated by commas or spaces, any case.
NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
OURS = "CI"  # the codes this tool reports; other codes in a directive belong to other tools


def noqa_directives(text: str) -> dict[int, tuple[int, frozenset[str] | None]]:
    """{line: (column of the `#`, the codes named, upper-case; None for a bare `# noqa`)} of a file's text."""
    found = {}
    if "noqa" not in text.lower():
        return found
    for number, line in enumerate(split_lines(text), start=1):  # lines as findings number them
        if "noqa" in line.lower():
            match = NOQA.search(line)
            if match is not None:
                codes = match.group("codes")
                found[number] = (match.start() + 1, None if codes is None else frozenset(
                    code.upper() for code in re.split(r"[,\s]+", codes.strip()) if code
                ))
    return found


def ignored(finding: Finding, catalog: Catalog) -> bool:
    """Whether the settings silence this finding (`ignore`, or a `per-file-ignores` pattern of its file)."""
    if finding.code in catalog.ignore:
        return True
    posix = Path(finding.path).as_posix()
    return any(finding.code in codes and path_matches(posix, pattern) for pattern, codes in catalog.per_file_ignores)


def apply_suppressions(findings: list[Finding], directives: dict[str, dict], catalog: Catalog) -> list[Finding]:
    """The findings left once the settings and the `# noqa` directives have silenced theirs, with a CI401
    finding for each code of ours a directive names that silenced nothing. `directives`: for each file
    read (by its path as a string), `noqa_directives` of its text."""
    kept = []
    used: set[tuple[str, int, str]] = set()
    for finding in findings:
        if ignored(finding, catalog):
            continue
        key = str(finding.path)
        directive = directives.get(key, {}).get(finding.line)
        if directive is not None:
            codes = directive[1]
            if codes is None:
                continue
            if finding.code in codes:
                used.add((key, finding.line, finding.code))
                continue
        kept.append(finding)
    for key, lines in directives.items():
        for line, (col, codes) in lines.items():
            for code in sorted(codes or ()):
                if code.startswith(OURS) and (key, line, code) not in used:
                    stale = ci401_unused_noqa.finding(Path(key), line, col, code)
                    if not ignored(stale, catalog):
                        kept.append(stale)
    kept.sort(key=lambda f: (str(f.path), f.line, f.col, f.code))
    return kept
