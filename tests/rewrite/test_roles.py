"""One before/after case per site role and per tricky shape, for scaffold and apply (and revert back).

The long cases live in cases/roles/, one file each (case_files.py says their form), and the inputs of the
tests that look at part of apply's output in cases/apply/; short ones stay inline."""

from __future__ import annotations

import pytest

import case_files
from rewrite_trees import dedent

MR = "pkg/srt/model_executor/model_runner.py"
CG = "pkg/srt/model_executor/cuda_graph_runner.py"
EW = "pkg/srt/speculative/eagle_worker_v2.py"
DE = "pkg/srt/speculative/eagle_draft_extend_cuda_graph_runner.py"

FORWARD = case_files.load("roles", "forward_site_joins_multi_item_with")


@pytest.mark.parametrize("name", case_files.names("roles"))
def test_case_file(tree, name):
    """Each command of the case leaves the file byte for byte as its output section says."""
    case_files.run(tree, case_files.load("roles", name))


def test_install_hook_is_undone_by_revert(tree):
    case_files.run(tree, case_files.load("roles", "install_and_init_finished_hooks_follow_anchors"))
    tree.run("revert")
    assert "install_canary" not in tree.read(MR) and "canary_ctx = cl.nullcontext()" in tree.read(MR)


def test_apply_after_revert_restores_the_wiring_once(tree):
    case_files.run(tree, case_files.load("roles", "apply_removes_scaffolds_contextlib_import"))
    assert tree.run("apply").changes and tree.run("apply").changes == []


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
@pytest.mark.parametrize("indent", ["    ", "\t", "  "])
def test_crlf_and_indentation_are_kept(tree, newline, indent):
    def styled(text):
        return dedent(text).replace("    ", indent).replace("\n", newline).encode()

    source = '''
        import contextlib
        class ModelRunner:
            def forward(self, forward_batch):
                with tracer():
                    return self._forward_raw(forward_batch)
        '''
    tree.write({MR: styled(source)})
    tree.run("scaffold")
    assert (tree.root / MR).read_bytes() == styled('''
        import contextlib
        class ModelRunner:
            def forward(self, forward_batch):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx, tracer():
                    return self._forward_raw(forward_batch)
        ''')
    scaffolded = (tree.root / MR).read_bytes()
    tree.run("apply")
    wired = (tree.root / MR).read_bytes()
    assert b"canary_ctx = self.canary_ctx(forward_batch, outside=[0], active=0)" in wired
    assert wired.count(b"\r\n") == (wired.count(b"\n") if newline == "\r\n" else 0)
    tree.run("revert")
    assert (tree.root / MR).read_bytes() == scaffolded


def test_scaffold_and_apply_twice_change_nothing_the_second_time(tree):
    tree.write({MR: FORWARD.source})
    tree.run("scaffold")
    once = tree.read(MR)
    assert tree.run("scaffold").changes == [] and tree.read(MR) == once
    tree.run("apply")
    wired = tree.read(MR)
    assert tree.run("apply").changes == [] and tree.read(MR) == wired


def test_apply_refuses_a_site_without_placeholder(tree):
    tree.write({MR: FORWARD.source})
    result = tree.run("apply")
    # CI102 and CI209 are about the rest of the layout, which this one-file tree does not hold.
    assert [f.code for f in result.findings if f.code not in ("CI102", "CI209")] == ["CI101"]
    assert result.exit_code == 1


def test_diff_mode_writes_nothing(tree):
    tree.write({MR: FORWARD.source})
    result = tree.run("scaffold", write=False)
    assert tree.read(MR) == FORWARD.source
    assert "+        canary_ctx = contextlib.nullcontext()" in result.changes[0].diff()


def test_apply_skips_a_site_whose_wiring_reads_a_name_the_method_lacks(tree):
    tree.write(case_files.files("apply", "wiring_reads_a_name_the_method_lacks"))
    result = tree.run("apply")
    findings = [f for f in result.findings if f.code not in ("CI102", "CI209")]  # the rest of the layout
    assert [(f.code, f.line) for f in findings] == [("CI207", 6)]
    assert "forward_batch" in findings[0].message
    assert "self.canary_ctx(" not in tree.read(EW)


def test_apply_keeps_a_contextlib_import_the_file_uses_outside_its_sites(tree):
    tree.write(case_files.files("apply", "contextlib_used_outside_the_sites"))
    tree.run("apply")
    assert tree.read(CG).startswith("import contextlib\n\nfrom canary_instrument.runtime import canary_context\n")


def test_revert_spells_the_placeholder_as_scaffold_once_apply_removed_the_file_s_own_factory_import(tree):
    """Documented limitation (docs/cli.md): apply records nothing, so an aliased factory import that
    only the placeholders used comes back as scaffold's `import contextlib`."""
    case = case_files.load("revert", "aliased_factory_import_comes_back_as_scaffolds")
    [(revert, reverted)] = case.outputs
    tree.write({CG: case.source.encode()})
    tree.run("apply")
    wired = tree.read(CG)
    assert "nullcontext" not in wired and wired.startswith("from canary_instrument.runtime import canary_context\n")
    tree.run(revert)
    assert tree.read(CG) == reverted
    tree.run("apply")
    assert tree.read(CG) == wired


def test_revert_writes_one_spelling_for_every_placeholder_of_a_file(tree):
    """Documented limitation (docs/cli.md): placeholders spelled two ways in one file come back one way."""
    tree.write(case_files.files("apply", "placeholders_spelled_two_ways"))
    tree.run("apply")
    assert "contextlib" not in tree.read(EW)
    tree.run("revert")
    reverted = tree.read(EW)
    assert reverted.startswith("import contextlib\n\n\nclass EAGLEWorkerV2:\n")
    assert reverted.count("= contextlib.nullcontext()") == 2


def test_apply_keeps_a_factory_import_the_module_re_exports(tree):
    tree.write(case_files.files("apply", "factory_import_re_exported"))
    tree.run("apply")
    assert tree.read(CG).startswith("from contextlib import nullcontext\n")


def test_a_site_two_roles_fit_equally_well_is_ci108_and_apply_leaves_it_alone(tree):
    """The catalog (cases/catalogs/) has two roles of one shape that would wire the site differently."""
    catalog = case_files.CASES / "catalogs" / "two_roles_of_one_shape.toml"
    source = ("import contextlib\n\n\nclass Runner:\n    def run(self):\n"
              "        canary_ctx = contextlib.nullcontext()\n        with canary_ctx:\n            self.step()\n")
    tree.write({"engine.py": source.encode()})

    def found(result):
        return [f"{f.line}:{f.col}: {f.code} {f.message}" for f in result.findings]

    assert found(tree.run("check", catalog)) == [
        "6:9: CI108 `canary_ctx` fits the catalog roles step_a, step_b equally well; make one more specific "
        "(calls, requires, class_refs, loop) in the catalog",
        "8:13: CI101 step_a site in Runner.run has no `canary_ctx` placeholder; run `canary-instrument scaffold`",
        "8:13: CI101 step_b site in Runner.run has no `canary_ctx` placeholder; run `canary-instrument scaffold`",
    ]
    applied = tree.run("apply", catalog)
    assert found(applied) == [
        "6:9: CI108 `canary_ctx` fits the catalog roles step_a, step_b equally well; left alone",
        "8:13: CI101 step_a site in Runner.run has no placeholder; run `canary-instrument scaffold` first",
        "8:13: CI101 step_b site in Runner.run has no placeholder; run `canary-instrument scaffold` first",
    ]
    assert applied.changes == [] and tree.read("engine.py") == source
