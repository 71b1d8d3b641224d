"""The tool on released sglang trees, as a user runs it: upstream's hand-wired tree and its placeholder state.

Per release, once (the outcome is shared by the tests of that release):
- hand-wired (upstream as released): `check`, `apply --diff`, `apply`, `check`, `apply --check`, `revert`;
- placeholder state (tests/realtree/placeholders.py, independent of the product): `check`, `apply`,
  `check`, `apply --check`, `revert`.
The placeholder helper's counts are the ground truth for "wired / expected".
"""

from __future__ import annotations

import ast
import atexit
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.check import check_tree
from canary_instrument.rewrite.transforms.revert import revert_tree
from canary_instrument.rewrite.analysis.tree import RunResult
from canary_instrument.rewrite.transforms.apply import apply_tree

from .conftest import DEFAULT_RELEASE, release_params, sglang_srt
from .placeholders import Expected, make_placeholder_tree

# Site findings (CI1xx, CI2xx); CI301 (uncovered forward paths) is triaged in docs/ci301-triage.md.
SITE_CODES = ("CI1", "CI2")
HOOK_CALLS = ("install_canary", "mark_init_finished", "attach_radix_cache")


def site_codes(result: RunResult) -> Counter:
    return Counter(f.code for f in result.findings if f.code.startswith(SITE_CODES))


def differing(tree: Path, reference: Path) -> list[str]:
    """Python files whose bytes differ between two trees (or that only one has)."""
    ours = {p.relative_to(tree).as_posix(): p for p in tree.rglob("*.py")}
    theirs = {p.relative_to(reference).as_posix(): p for p in reference.rglob("*.py")}
    return sorted(
        rel for rel in ours.keys() | theirs.keys()
        if rel not in ours or rel not in theirs or ours[rel].read_bytes() != theirs[rel].read_bytes()
    )


def wired_sites(tree: Path, expected: Expected) -> int:
    """Sites holding generated wiring: `NAME = self.canary_ctx(...)` or `NAME = canary_context(...)`."""
    count = 0
    for rel, names in expected.sites.items():
        for node in ast.walk(ast.parse((tree / rel).read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
                target, callee = node.targets[0], ast.unparse(node.value.func)
                if isinstance(target, ast.Name) and target.id in names and callee in ("self.canary_ctx", "canary_context"):
                    count += 1
    return count


def placed_hooks(tree: Path, files) -> list[tuple[str, str, str]]:
    """(file, hook call, enclosing function) of every generated hook statement in `files`."""
    found = []
    for rel in files:
        module = ast.parse((tree / rel).read_text())
        for function in ast.walk(module):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for stmt in ast.walk(function):
                if isinstance(stmt, (ast.Expr, ast.Assign)) and isinstance(stmt.value, ast.Call):
                    callee = ast.unparse(stmt.value.func)
                    if callee in HOOK_CALLS:
                        found.append((rel, callee, function.name))
    return sorted(set(found))


@dataclass
class Outcome:
    version: str
    expected: Expected
    hand_check: RunResult
    hand_apply: RunResult
    hand_after: RunResult
    hand_again: RunResult
    hand_reverted: list[str]
    place_check: RunResult
    place_apply: RunResult
    place_after: RunResult
    place_again: RunResult
    place_reverted: list[str]
    wired: int
    hand_wired: int
    hooks: list[tuple[str, str, str]]
    reference: Path
    extra: dict = field(default_factory=dict)


_OUTCOMES: dict[str, Outcome] = {}


def outcome(version: str) -> Outcome:
    if version in _OUTCOMES:
        return _OUTCOMES[version]
    srt = sglang_srt(version)
    base = Path(tempfile.mkdtemp(prefix=f"realtree-{version}-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)  # three copies of `srt`, ~230 MB a release
    # Copied as `<tmp>/<name>/sglang/srt`, the layout of a checkout: `sglang` is the files' own package.
    hand, place, reference = (base / name / "sglang" / "srt" for name in ("hand", "place", "reference"))
    shutil.copytree(srt, hand)
    shutil.copytree(srt, reference)
    expected = make_placeholder_tree(reference)
    shutil.copytree(reference, place)
    catalog = load_catalog(hand)
    hand_check = check_tree([hand], catalog)
    hand_apply = apply_tree([hand], catalog)  # its changes are what `apply --diff` shows
    hand_after = check_tree([hand], catalog)
    hand_again = apply_tree([hand], catalog, write=False)
    hand_wired = wired_sites(hand, expected)
    revert_tree([hand], catalog)
    place_check = check_tree([place], catalog)
    place_apply = apply_tree([place], catalog)
    place_after = check_tree([place], catalog)
    place_again = apply_tree([place], catalog, write=False)
    wired = wired_sites(place, expected)
    hooks = placed_hooks(place, [c.path.relative_to(place).as_posix() for c in place_apply.changes])
    revert_tree([place], catalog)
    result = _OUTCOMES[version] = Outcome(
        version, expected, hand_check, hand_apply, hand_after, hand_again, differing(hand, reference),
        place_check, place_apply, place_after, place_again, differing(place, reference), wired, hand_wired, hooks,
        reference,
    )
    return result


releases = pytest.mark.parametrize("version", release_params())


@releases
def test_hand_wired_tree_is_reported_as_hand_written_wiring_and_nothing_else(version):
    run = outcome(version)
    codes = site_codes(run.hand_check)
    assert run.hand_check.errors == []
    # Every hand-written site and hook is CI106; none is stray, duplicated or unusable.
    assert codes["CI106"] == run.expected.site_count + run.expected.hook_count
    assert not {"CI101", "CI103", "CI104", "CI105"} & set(codes)
    assert set(codes) <= {"CI106", "CI107"}
    for finding in run.hand_check.findings:
        if finding.code == "CI107":  # a construct no role covers comes with the entry that would
            assert "[tool.canary-instrument]" in finding.message and "sites = [{" in finding.message


@releases
def test_apply_migrates_the_hand_written_wiring_and_revert_gives_the_placeholder_state(version):
    run = outcome(version)
    diff = "".join(change.diff() for change in run.hand_apply.changes)
    assert run.hand_apply.errors == [] and "\n-        canary_ctx = (\n" in diff and "\n+    def canary_ctx(self" in diff
    assert run.hand_wired == run.expected.site_count
    assert site_codes(run.hand_after) == Counter()
    assert run.hand_again.changes == []  # `apply --check`: nothing left to change ...
    # ... and the same findings as `check` (the forward paths CI301 finds uncovered, as apply reports them)
    assert run.hand_again.findings == run.hand_after.findings == run.hand_apply.findings
    assert {f.code for f in run.hand_again.findings} <= {"CI301"}
    assert run.hand_reverted == []  # byte for byte the independent placeholder state


@releases
def test_apply_wires_every_site_and_places_every_hook_on_the_placeholder_state(version):
    run = outcome(version)
    assert run.place_check.errors == [] and run.place_apply.errors == []
    assert site_codes(run.place_check) == Counter()  # placeholders everywhere, no hook yet: a clean tree
    assert run.wired == run.expected.site_count
    # Every hook upstream has is placed, in the file and function upstream chose.
    upstream = sorted({(rel, call, function) for rel, hooks in run.expected.hooks.items() for call, function in hooks})
    assert set(upstream) <= set(run.hooks), (upstream, run.hooks)
    assert site_codes(run.place_after) == Counter()
    assert run.place_again.changes == []  # apply twice: no change
    assert run.place_again.findings == run.place_after.findings == run.place_apply.findings  # as check reports
    assert {f.code for f in run.place_again.findings} <= {"CI301"}
    assert run.place_reverted == []


def test_check_on_a_wired_tree_imports_no_torch():
    srt = sglang_srt(DEFAULT_RELEASE)  # upstream's hand-wired tree, as released
    code = (
        "import sys\n"
        "from canary_instrument.cli import main\n"
        "try:\n"
        f"    main(['check', '--no-cache', {str(srt)!r}], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules and 'libcst' not in sys.modules, 'check imported torch or libcst'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
