"""What check knows about one file, as plain data (no AST objects, so that its cache can keep it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.analysis.placement import Placement
from canary_instrument.rewrite.analysis.reach import ReachFacts


@dataclass
class FileReport:
    """One file's findings, the tree-dependent ones kept apart, and the facts the tree pass needs."""

    path: Path
    findings: list[Finding] = field(default_factory=list)  # hold whatever the rest of the tree is
    when_wired: list[Finding] = field(default_factory=list)  # hold only if some site in the tree is wired
    when_unwired: list[Finding] = field(default_factory=list)  # hold only if no site in the tree is wired
    wired: bool = False  # a site in this file holds generated wiring
    placement: Placement | None = None  # roles expected and located, hooks needed and placed (None: a path only)
    handed: set[str] = field(default_factory=set)  # modules its model runner hands itself to for graph capture
    reach: ReachFacts | None = None  # CI301's facts: functions, calls, triggers (None: not in the call graph)
    # `# noqa` directives: {line: (column, codes or None for a bare one)} (rewrite/suppressions.py)
    suppressions: dict[int, tuple[int, frozenset[str] | None]] = field(default_factory=dict)
