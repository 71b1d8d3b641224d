"""`apply` on refactors of released sglang trees: every site and hook, or exit 1 with a finding (issue 20).

Per release, two trees are refactored by each refactor of refactors.py: the release as shipped
("released": upstream's hand-written wiring, which `apply` migrates) and its placeholder state
("placeholder": placeholders.py, what a user who ran `scaffold` has). `apply` runs on each result.
Measured per tree, against upstream's sites and hooks (what `apply` wires on the unrefactored release),
mapped through the refactor (same number of sites per file, each hook in the same file and function):
sites wired, hooks placed (statements `apply` generated), apply's exit code and findings, generated code
that reads an attribute nothing in the tree assigns or a name its function does not bind (`dangling`),
and the files a second `apply` would still change (reported, not asserted).

The property (issue 20, "Done when"): no dangling read, and either every site wired and hook placed, or
exit 1 with a finding. Trees that violate it today are strict xfails naming what goes missing, so that a
fix shows up as an XPASS failure (then drop its VIOLATIONS entry). `refactor_report.py` prints the table.
Every tree runs under `-m realtree` only: each costs a whole-release `apply`, too slow for the default
suite, which runs the generator's own checks at the end of this file.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.check import uncovered_forwards
from canary_instrument.rewrite.findings import Finding
from canary_instrument.rewrite.transforms.apply import apply_tree

from .conftest import RELEASES, sglang_srt
from .placeholders import Expected, make_placeholder_tree
from .refactors import REFACTORS, Refactored, RefactorError, extract_method, inline_super_init, make_refactored, \
    rename_source

HOOK_CALLS = ("install_canary", "mark_init_finished", "attach_radix_cache")
WIRING_CALLS = ("self.canary_ctx", "canary_context")
MEMBER = "canary_ctx"
UNREFACTORED = "unrefactored"
BUILTINS = set(dir(builtins))


@dataclass
class Measured:
    release: str
    state: str  # "released" (upstream's hand-written wiring, which apply migrates) or "placeholder"
    refactor: str
    note: str
    sites: int = 0
    sites_expected: int = 0
    sites_extra: int = 0
    hooks: int = 0
    hooks_expected: int = 0
    hooks_extra: list[str] = field(default_factory=list)
    exit_code: int = 0
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # expected sites and hooks not wired / placed
    dangling: list[str] = field(default_factory=list)
    again: int = 0  # files a second `apply` would change
    unreported: list[str] = field(default_factory=list)  # forwards a fork added that no CI301 names


    @property
    def complete(self) -> bool:
        return self.sites == self.sites_expected and self.hooks == self.hooks_expected

    @property
    def loud(self) -> bool:
        # A finding about what could not be placed: the uncovered forward paths (CI301) that apply reports
        # on the unrefactored release too say nothing about a site or hook left out.
        return self.exit_code == 1 and any(f.code != "CI301" for f in self.findings)

    @property
    def holds(self) -> bool:
        return not self.dangling and not self.unreported and (self.complete or self.loud)

    def finding_codes(self) -> str:
        return ", ".join(f"{c}×{n}" for c, n in sorted(Counter(f.code for f in self.findings).items())) or "none"

    def summary(self) -> str:
        return "\n".join([
            f"{self.release} {self.state} {self.refactor} ({self.note}): sites {self.sites}/{self.sites_expected}, "
            f"hooks {self.hooks}/{self.hooks_expected}, exit {self.exit_code}, findings {self.finding_codes()}",
            *(f"  missing: {m}" for m in self.missing), *(f"  extra hook: {h}" for h in self.hooks_extra),
            *(f"  dangling: {d}" for d in self.dangling), *(f"  unreported forward: {u}" for u in self.unreported),
            *(f"  finding: {f}" for f in self.findings),
            *(f"  error: {e}" for e in self.errors), f"  second apply changes {self.again} files",
        ])


STATES = ("placeholder", "released")
_BASES: dict[str, tuple[dict[str, Path], Expected]] = {}


def _py_only(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".py") and not Path(folder, n).is_dir()]


def bases(version: str) -> tuple[dict[str, Path], Expected]:
    """The release's `srt` as released and in its placeholder state (Python files only), once per process."""
    if version not in _BASES:
        for (trees, _) in _BASES.values():  # tests and report rows come release by release: keep one
            shutil.rmtree(trees["released"].parents[2], ignore_errors=True)
        _BASES.clear()
        base = Path(tempfile.mkdtemp(prefix=f"refactor-{version}-"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        trees = {state: base / state / "sglang" / "srt" for state in STATES}
        shutil.copytree(sglang_srt(version), trees["released"], ignore=_py_only)
        shutil.copytree(trees["released"], trees["placeholder"])
        _BASES[version] = trees, make_placeholder_tree(trees["placeholder"])
    return _BASES[version]


def _functions(tree: ast.AST):
    """(node, innermost enclosing function) for every node of a module."""
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            yield child, function
            yield from visit(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function)
    yield from visit(tree, None)


def _bound(function) -> set[str]:
    if function is None:
        return set()
    args = function.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a}
    return names | {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class _Definitions:
    """Does anything in the tree assign an attribute (or define a method or class-level name) so named?"""

    def __init__(self, root: Path):
        self.text = "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py"))
        self.seen: dict[str, bool] = {}

    def __contains__(self, attr: str) -> bool:
        if attr not in self.seen:
            a = re.escape(attr)
            pattern = rf"\.{a}\s*(:[^=\n]*)?=[^=]|\bdef\s+{a}\b|^[ \t]+{a}\s*(:[^\n]*|=[^=].*)$"
            self.seen[attr] = re.search(pattern, self.text, re.M) is not None
        return self.seen[attr]


def _reads(expression: ast.AST, function, module_names: set[str], definitions: _Definitions, where: str) -> list[str]:
    """What generated code reads that does not exist: attributes nothing assigns, names nothing binds."""
    out = []
    for node in ast.walk(expression):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr not in definitions:
            out.append(f"{where} reads .{node.attr}, which nothing in the tree assigns")
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id not in _bound(function) | module_names | BUILTINS:
                out.append(f"{where} reads {node.id}, which its function does not bind")
    return out


def measure(version: str, state: str, refactor: str) -> Measured:
    """Refactor a copy of the release (as released, or its placeholder state), `apply` it and compare with what
    the unrefactored release has: upstream's sites and hooks."""
    trees, expected = bases(version)
    source = trees[state]
    work = Path(tempfile.mkdtemp(prefix=f"refactor-{version}-{state}-{refactor}-"))
    try:
        root = work / "sglang" / "srt"
        if refactor == UNREFACTORED:
            shutil.copytree(source, root)
            done = Refactored("none")
        else:
            done = make_refactored(source, root, refactor)
        catalog = load_catalog(root)
        result = apply_tree([root], catalog)
        again = apply_tree([root], catalog, write=False)
        return _compare(version, state, refactor, done, expected, root, result, len(again.changes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hook_statements(module: ast.Module) -> set[str]:
    return {ast.dump(n) for n in ast.walk(module) if isinstance(n, (ast.Assign, ast.Expr))
            and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) in HOOK_CALLS}


def _compare(version: str, state: str, refactor: str, done: Refactored, expected: Expected, root: Path, result,
             again: int) -> Measured:
    m = Measured(version, state, refactor, done.note, exit_code=result.exit_code, findings=list(result.findings),
                 errors=[str(e) for e in result.errors], again=again)
    want_sites = Counter({done.path(rel): len(names) for rel, names in expected.sites.items()})
    want_hooks = {(done.path(rel), call, done.name(function)) for rel, hooks in expected.hooks.items()
                  for call, function in hooks}
    placeholders = {name for names in expected.sites.values() for name in names}
    definitions = _Definitions(root)
    got_sites: Counter = Counter()
    got_hooks = set()
    for change in result.changes:
        rel = change.path.relative_to(root).as_posix()
        module = ast.parse(change.new)
        before = _hook_statements(ast.parse(change.old))  # upstream's install statement calls install_canary too
        module_names = {a.asname or a.name.split(".")[0] for n in ast.walk(module)
                        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        module_names |= {n.name for n in module.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node, function in _functions(module):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            call = getattr(node, "value", None)
            if not isinstance(node, (ast.Assign, ast.Expr)) or not isinstance(call, ast.Call):
                if isinstance(node, ast.FunctionDef) and node.name == MEMBER and function is None:
                    m.dangling += [d for stmt in node.body
                                   for d in _reads(stmt, node, module_names, definitions, f"{where} generated member")]
                continue
            callee = ast.unparse(call.func)
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if callee in WIRING_CALLS and isinstance(target, ast.Name) and target.id in placeholders:
                got_sites[rel] += 1
                m.dangling += _reads(call, function, module_names, definitions, f"{where} site wiring")
            elif callee in HOOK_CALLS and ast.dump(node) not in before:
                got_hooks.add((rel, callee, function.name if function else "<module>"))
                m.dangling += _reads(call, function, module_names, definitions, f"{where} hook")
    m.sites_expected, m.hooks_expected = sum(want_sites.values()), len(want_hooks)
    m.sites = sum(min(n, want_sites[rel]) for rel, n in got_sites.items())
    m.sites_extra = sum(got_sites.values()) - m.sites
    m.hooks = len(want_hooks & got_hooks)
    m.hooks_extra = sorted(f"{c} in {r}:{f}" for r, c, f in got_hooks - want_hooks)
    m.missing = [f"{want_sites[rel] - got_sites[rel]} site(s) in {rel}" for rel in sorted(want_sites)
                 if got_sites[rel] < want_sites[rel]]
    m.missing += [f"{c} in {r}:{f}" for r, c, f in sorted(want_hooks - got_hooks)]
    # A forward a fork added outside every site: apply exits 1 with a CI301 at it. Lines are the
    # refactored tree's; apply may move them (its edits to that file), so a finding's line is
    # matched against where the forward's statement is after apply too.
    reported = {(f.path.relative_to(root).as_posix(), f.line) for f in result.findings if f.code == "CI301"}
    for rel, line in done.forwards:
        text = _line_text(change_old(result, root, rel), line)
        after = {number for number, found in enumerate((root / rel).read_text().splitlines(), 1) if found == text}
        if result.exit_code != 1 or not ({(rel, line)} | {(rel, n) for n in after}) & reported:
            m.unreported.append(f"{rel}:{line} {text.strip()}")
    return m


def change_old(result, root: Path, rel: str) -> str:
    """The file's text before apply changed it (as refactored)."""
    for change in result.changes:
        if change.path.relative_to(root).as_posix() == rel:
            return change.old.decode("utf-8")
    return (root / rel).read_text()


def _line_text(text: str, line: int) -> str:
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


# --------------------------------------------------------------------------- the trees

# Trees that violate the property: (release or "*", state or "*", refactor) -> what goes missing. None today;
# an entry makes its trees strict xfails, so that a fix shows up as an XPASS failure.
VIOLATIONS: dict[tuple[str, str, str], str] = {}


def violation(version: str, state: str, refactor: str) -> str | None:
    for key in ((version, state, refactor), (version, "*", refactor), ("*", state, refactor), ("*", "*", refactor)):
        if key in VIOLATIONS:
            return VIOLATIONS[key]
    return None


def _params():
    for version in RELEASES:
        for state in STATES:
            for refactor in [UNREFACTORED, *REFACTORS]:
                reason = violation(version, state, refactor)
                marks = [pytest.mark.realtree]
                if reason:
                    marks.append(pytest.mark.xfail(strict=True, reason=f"issue 20: {reason}"))
                yield pytest.param(version, state, refactor, marks=marks, id=f"{version}-{state}-{refactor}")


@pytest.mark.parametrize("version,state,refactor", list(_params()))
def test_refactored_tree_is_wired_completely_or_apply_fails_loudly(version, state, refactor):
    try:
        m = measure(version, state, refactor)
    except RefactorError as error:
        pytest.skip(f"{refactor} does not apply to {version}: {error}")
    print(m.summary())
    assert m.errors == [], m.summary()
    assert m.holds, m.summary()


# --------------------------------------------------------------------------- the generator itself (default suite)

SAMPLE = '''\
"""ModelRunner and tree_cache in a docstring stay."""
from .model_runner import ModelRunner  # ModelRunner in a comment stays
from sglang.srt.managers import scheduler
import sglang.srt.managers.scheduler as sched

runner: "Optional[ModelRunner]" = None
label = "a ModelRunner, by name"
target = "sglang.srt.managers.scheduler.Scheduler"
cache = getattr(runner, "tree_cache")
log = f"{runner.tree_cache} tree_cache"


class ModelRunnerOutput:  # another name that merely starts the same
    tree_cache_size = 0


def build(tree_cache=None):
    return ModelRunner(tree_cache=tree_cache), sglang.srt.managers.scheduler.Scheduler
'''


def test_token_renamer_renames_identifiers_and_module_paths_but_leaves_comments_and_prose():
    names = {"ModelRunner": "ModelExecutor", "tree_cache": "prefix_cache"}
    modules = {("sglang", "srt", "managers", "scheduler"): "batch_scheduler",
               ("sglang", "srt", "model_executor", "model_runner"): "runner_core"}
    new = rename_source(SAMPLE, names, modules, ("sglang", "srt", "model_executor"))
    ast.parse(new)
    assert new.splitlines()[0] == SAMPLE.splitlines()[0]  # docstring
    assert "from .runner_core import ModelExecutor  # ModelRunner in a comment stays" in new
    assert "from sglang.srt.managers import batch_scheduler as scheduler" in new
    assert "import sglang.srt.managers.batch_scheduler as sched" in new
    assert 'runner: "Optional[ModelExecutor]"' in new and 'label = "a ModelRunner, by name"' in new
    assert 'target = "sglang.srt.managers.batch_scheduler.Scheduler"' in new
    assert 'getattr(runner, "prefix_cache")' in new and 'f"{runner.prefix_cache} tree_cache"' in new
    assert "class ModelRunnerOutput:" in new and "tree_cache_size = 0" in new
    assert "return ModelExecutor(prefix_cache=prefix_cache), sglang.srt.managers.batch_scheduler.Scheduler" in new
    assert rename_source(SAMPLE, {}, {}) == SAMPLE


def test_extract_method_and_inline_super_init_keep_the_file_parseable(tmp_path):
    (tmp_path / "base.py").write_text(
        "class Base:\n    def __init__(self):\n        '''Doc.'''\n        self.ready = {}\n")
    (tmp_path / "worker.py").write_text(
        "class Worker(Base):\n"
        "    def __init__(self, x):\n        super().__init__()\n        self.x = x\n\n"
        "    @staticmethod\n    def helper():\n        pass\n\n"
        "    def run(self, batch, *rest, flag=False, **extra):\n        '''Run.'''\n"
        "        # a comment that moves with the body\n        return batch, rest, flag, extra\n"
    )
    extract_method(tmp_path, ["Worker"], ["run"], "_run_body")
    inline_super_init(tmp_path, ["Worker"])
    text = (tmp_path / "worker.py").read_text()
    namespace: dict = {}
    exec(compile((tmp_path / "base.py").read_text() + text, "worker.py", "exec"), namespace)
    worker = namespace["Worker"](1)
    assert worker.ready == {} and worker.run(2, 3, flag=True, k=4) == (2, (3,), True, {"k": 4})
    assert "super()" not in text and "        return self._run_body(batch, *rest, flag=flag, **extra)\n" in text
    with pytest.raises(RefactorError):
        extract_method(tmp_path, ["Worker"], ["run"], "_run_body")  # the name is taken now


def test_fork_transformations_add_forwards_outside_every_site_and_say_where(tmp_path):
    (tmp_path / "eagle_worker_v2.py").write_text(
        "class EagleDraftWorker:\n"
        "    def __init__(self, worker):\n"
        "        self.draft_worker = worker\n"
        "        self.draft_runner = self.draft_worker.model_runner\n\n"
        "    def draft(self, batch):\n        return batch\n"
    )
    (tmp_path / "model_runner.py").write_text("class ModelRunner:\n    def forward(self, batch):\n        return batch\n")
    done = [REFACTORS[name][1](tmp_path) for name in ("fork-legacy-draft", "fork-multi-layer-draft",
                                                      "fork-autotune-forward")]
    worker = (tmp_path / "eagle_worker_v2.py").read_text()
    runner = (tmp_path / "model_runner.py").read_text()
    ast.parse(worker), ast.parse(runner)
    assert "        self.draft_model_runner = self.draft_worker.model_runner\n" in worker
    assert "class MultiLayerEagleDrafter(EagleDraftWorker):" in worker
    found = [(rel, (tmp_path / rel).read_text().splitlines()[line - 1].strip()) for d in done for rel, line in d.forwards]
    assert [rel for rel, _ in found] == ["eagle_worker_v2.py", "eagle_worker_v2.py", "model_runner.py"]
    assert found[0][1] == "return self.draft_model_runner.forward(forward_batch)"
    assert found[1][1] == "outputs.append(self.draft_runner.forward(forward_batch))"
    assert found[2][1].startswith("return self.model.forward(")


def test_a_renamed_package_folder_reports_the_uncovered_forwards_of_the_release(tmp_path):
    # CI301's files follow what the code imports and types, not folder names: with `model_executor/`
    # renamed, the receiver `self.prefill_cuda_graph_runner` (typed `BaseRunner` through what
    # `capture_prefill_graph` returns) still reaches `PrefillCudaGraphRunner.execute`.
    trees, _ = bases("0.5.20")
    source = trees["placeholder"]
    root = tmp_path / "sglang" / "srt"
    done = make_refactored(source, root, "module-folder")
    before = {(f.path.relative_to(source).as_posix(), f.line) for f in uncovered_forwards([source], load_catalog(source))}
    after = {(f.path.relative_to(root).as_posix(), f.line) for f in uncovered_forwards([root], load_catalog(root))}
    assert after == {(done.path(rel), line) for rel, line in before}
