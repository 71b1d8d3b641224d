"""Before/after cases for the shapes real sglang trees use: hand-written wiring (CI106) and its migration,
sites passed as an argument, module-level functions that receive the model runner, hooks found by shape,
the runtime import in its isort section, and hand-wired constructs no role covers (CI107).

The inputs are case files in cases/handwritten/ (case_files.py says their form)."""

from __future__ import annotations

import pytest

import case_files
from rewrite_trees import dedent

MR = "pkg/srt/model_executor/model_runner.py"
GR = "pkg/srt/model_executor/runner/decode_graph_runner.py"
SETUP = "pkg/srt/model_executor/model_runner_components/cuda_graph_setup.py"
TUNE = "pkg/srt/model_executor/runner/autotune.py"


def codes(result):
    """Finding codes about the sites and hooks of the file at hand. CI102 (a role of another file of the
    layout not found), CI209 (a hook another file of the layout would hold) and CI301 (forward paths) are
    tree-level: these trees hold one file of a layout."""
    return sorted(f.code for f in result.findings if f.code not in ("CI102", "CI209", "CI301"))


def flat(text):
    """Code with its line breaks and indentation folded, for generated lines the line limit may wrap."""
    return " ".join(text.replace("(\n", "(").replace("\n)", ")").split()).replace("( ", "(").replace(" )", ")")


@pytest.mark.parametrize("test", [
    "not self.is_draft_worker and ((c := self.canary_manager) is not None)",
    "(c := self.canary_manager) is not None and not self.is_draft_worker",
    "((c := self.canary_manager) is not None) and (not self.is_draft_worker)",
])
def test_hand_written_forward_site_in_either_guard_order_is_ci106_and_migrates_to_the_member(tree, test):
    case = case_files.load("handwritten", "forward_site_guard_migrates_to_the_member")
    (apply, wired), (revert, reverted) = case.outputs
    tree.write({MR: case.source.format(test=test).encode()})
    assert codes(tree.run("check")) == ["CI106"]
    tree.run(apply)
    # The null context was the only use of `import contextlib`, upstream's `context_tuple` import goes too.
    assert flat(tree.read(MR)) == flat(wired)
    assert codes(tree.run("check")) == []
    tree.run(revert)  # the clean placeholder state, upstream's context_tuple import gone
    assert tree.read(MR) == reverted


def test_capture_site_gets_the_draft_worker_guard_upstream_left_out(tree):
    tree.write(case_files.files("handwritten", "capture_site_without_the_draft_worker_guard"))
    result = tree.run("apply")
    [change] = result.changes
    assert "+        canary_ctx = self.canary_ctx(active=0)\n" in change.diff()
    assert "manager = (None if self.model_runner.is_draft_worker else self.model_runner.canary_manager)" in flat(
        tree.read(GR))


def test_a_placeholder_passed_as_run_ctx_is_a_dummy_run_site(tree):
    tree.write(case_files.files("handwritten", "placeholder_passed_as_run_ctx"))
    assert codes(tree.run("check")) == []
    tree.run("apply")
    text = tree.read(GR)
    assert "        canary_run_ctx = self.canary_ctx(active=0)\n" in text
    assert "def canary_ctx(self, forward_batch=None" in text
    tree.run("revert")
    assert "canary_run_ctx = contextlib.nullcontext()" in tree.read(GR)


def test_a_site_in_a_module_level_function_calls_canary_context_through_its_model_runner(tree):
    tree.write(case_files.files("handwritten", "site_in_a_module_level_function"))
    assert codes(tree.run("check")) == ["CI106"]
    tree.run("apply")
    text = tree.read(TUNE)
    assert text.startswith(dedent('''
        import functools

        from canary_instrument.runtime import canary_context
        from sglang.srt.utils import log_info_on_rank0
        '''))
    # No member in a function: a direct call, the manager and the guard spelled through `mr`.
    assert "canary_run_ctx = canary_context(None if mr.is_draft_worker else mr.canary_manager, active=0)" in flat(text)
    assert codes(tree.run("check")) == []


def test_init_finished_goes_at_the_end_of_a_module_level_capture_function_taking_the_model_runner(tree):
    case = case_files.load("handwritten", "capture_function_taking_the_model_runner")
    tree.write({SETUP: case.source.format(hook="""
    if model_runner.canary_manager is not None and not model_runner.is_draft_worker:
        model_runner.canary_manager.mark_init_finished()
""")})
    assert codes(tree.run("check")) == ["CI106"]
    tree.run("apply")
    text = tree.read(SETUP)
    assert text.startswith("from canary_instrument.runtime import mark_init_finished\nfrom sglang.srt.configs import")
    assert flat(text).endswith(
        "prefill = model_runner.init_prefill_cuda_graph() "
        "mark_init_finished(model_runner.canary_manager if not model_runner.is_draft_worker else None) "
        "return decode, prefill"
    )
    tree.run("revert")
    assert "mark_init_finished" not in tree.read(SETUP)


def test_install_goes_right_after_the_pool_exists_and_an_upstream_install_import_is_replaced(tree):
    tree.write(case_files.files("handwritten", "upstream_install_after_the_pool"))
    assert codes(tree.run("check")) == ["CI106"]
    tree.run("apply")
    text = tree.read(MR)
    # One import of install_canary, the runtime's, in the third-party block beside torch.
    assert "import torch\nfrom canary_instrument.runtime import install_canary, mark_init_finished\n" in text
    assert "sglang.srt.kv_canary" not in text
    assert "self.canary_manager = install_canary(server_args=self.server_args, model_runner=self)" in flat(text)
    tree.run("revert")
    text = tree.read(MR)
    assert "install_canary" not in text and "mark_init_finished" not in text
    # On the placeholder state the install hook goes where upstream had it: the pool's method hands
    # over to a post-pool method, whose start is right after the pool exists.
    tree.run("apply")
    text = flat(tree.read(MR))
    assert "def _init_post_memory_pool_components(self): self.canary_manager = install_canary(" in text


def test_attach_cache_hook_goes_after_the_schedulers_tree_cache(tree):
    tree.write(case_files.files("handwritten", "scheduler_tree_cache"))
    tree.run("apply")
    text = tree.read("pkg/srt/managers/scheduler.py")
    assert "        self.init_cache()\n        attach_radix_cache(self.tp_worker.model_runner.canary_manager, self.tree_cache)\n" in text
    assert "import logging\n\nfrom canary_instrument.runtime import attach_radix_cache\n" in text


def test_unknown_hand_wiring_is_ci107_with_a_catalog_entry_that_covers_it(tree, tmp_path):
    tree.write(case_files.files("handwritten", "unknown_warm_up_wiring"))
    result = tree.run("check")
    assert codes(result) == ["CI107"]
    [finding] = [f for f in result.findings if f.code == "CI107"]
    entry = finding.message.split("[tool.canary-instrument]: ", 1)[1]
    assert entry.startswith("sites = [{") and '"precompile_kernels"' in entry
    # Pasted into pyproject.toml, the entry covers it: the site is then CI106 and apply migrates it.
    (tmp_path / "pyproject.toml").write_text(f"[tool.canary-instrument]\n{entry}\n")
    assert codes(tree.run("check")) == ["CI106"]
    tree.run("apply")
    assert "canary_run_ctx = self.canary_ctx(active=0)" in tree.read(GR)
