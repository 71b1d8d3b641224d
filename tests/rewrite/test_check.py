"""check on the reference engine: clean states pass, and each finding code fires on the breakage it names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.check import check_tree
from canary_instrument.rewrite.transforms.scaffold import scaffold_tree
from canary_instrument.rewrite.transforms.apply import apply_tree

ENGINE = Path(__file__).resolve().parents[2] / "golden" / "engine"
MR = "refsgl/srt/model_executor/model_runner.py"
CG = "refsgl/srt/model_executor/cuda_graph_runner.py"
EW = "refsgl/srt/speculative/eagle_worker_v2.py"


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    base = tmp_path_factory.mktemp("check")
    result = {}
    for name in ("pristine", "scaffolded", "wired"):
        root = base / name
        shutil.copytree(ENGINE, root, ignore=shutil.ignore_patterns("__pycache__"))
        if name != "pristine":
            scaffold_tree([root], load_catalog(root))
        if name == "wired":
            apply_tree([root], load_catalog(root))
        result[name] = root
    return result


def broken(states, tmp_path, state, rel, old, new, count=1):
    root = tmp_path / "tree"
    shutil.copytree(states[state], root)
    path = root / rel
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, count))
    return root


def codes(root) -> list[str]:
    result = check_tree([root], load_catalog(root))
    assert result.errors == []
    return sorted(f.code for f in result.findings)


@pytest.mark.parametrize("state", ["scaffolded", "wired"])
def test_scaffolded_and_wired_engines_are_clean(states, state):
    result = check_tree([states[state]], load_catalog(states[state]))
    assert (result.exit_code, result.findings, result.errors) == (0, [], [])


def test_pristine_engine_misses_all_seven_placeholders(states):
    result = check_tree([states["pristine"]], load_catalog(states["pristine"]))
    assert [f.code for f in result.findings] == ["CI101"] * 7
    assert result.exit_code == 1
    assert {f.message.split()[0] for f in result.findings} == {
        "forward", "capture", "draft", "draft_step", "extend_prefill", "extend_decode", "extend_capture",
    }


def test_a_deleted_placeholder_is_missing(states, tmp_path):
    root = broken(states, tmp_path, "scaffolded", CG, "        canary_ctx = contextlib.nullcontext()\n", "")
    assert codes(root) == ["CI105"]  # `with canary_ctx:` left without its assignment


def test_a_placeholder_outside_every_site_is_stray(states, tmp_path):
    root = broken(
        states, tmp_path, "scaffolded", CG, "    def can_run(self, forward_batch: ForwardBatch) -> bool:\n",
        "    def can_run(self, forward_batch: ForwardBatch) -> bool:\n        canary_ctx = contextlib.nullcontext()\n",
    )
    assert codes(root) == ["CI103"]


def test_a_second_placeholder_in_a_site_method_is_duplicated(states, tmp_path):
    line = "        canary_outside_ctx = contextlib.nullcontext()\n"
    root = broken(states, tmp_path, "scaffolded", EW, line, line + line)
    assert codes(root) == ["CI104"]


def test_a_missing_install_hook_is_half_wired(states, tmp_path):
    root = broken(
        states, tmp_path, "wired", MR,
        "        self.canary_manager = install_canary(server_args=self.server_args, model_runner=self)\n", "",
    )
    assert codes(root) == ["CI202"]


def test_a_hook_without_any_wired_site_is_half_wired(states, tmp_path):
    root = broken(
        states, tmp_path, "scaffolded", EW, "        self.init_cuda_graphs()\n",
        "        self.init_cuda_graphs()\n        mark_init_finished(self.draft_runner.canary_manager)\n",
    )
    assert codes(root) == ["CI203"]


def test_a_placeholder_left_in_a_wired_tree_is_half_wired(states, tmp_path):
    root = broken(
        states, tmp_path, "wired", CG, "canary_ctx = self.canary_ctx(active=0)", "canary_ctx = contextlib.nullcontext()"
    )
    assert codes(root) == ["CI201", "CI204"]  # and the capture class keeps a member nothing uses


def test_wiring_that_differs_from_the_catalog_is_stale(states, tmp_path):
    root = broken(states, tmp_path, "wired", CG, "self.canary_ctx(active=0)", "self.canary_ctx(active=1)")
    assert codes(root) == ["CI205"]


def test_a_wired_class_without_its_member_is_half_wired(states, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(states["wired"], root)
    path = root / CG
    text = path.read_text()
    start = text.index("    # canary-instrument: generated")
    path.write_text(text[:start].rstrip("\n") + "\n")
    assert codes(root) == ["CI204"]


def test_a_new_graph_runner_class_is_an_uncovered_forward_path(states, tmp_path):
    root = broken(
        states, tmp_path, "scaffolded", CG, "class CudaGraphRunner:",
        "class PiecewiseCudaGraphRunner:\n    def capture(self, graph, run_once):\n"
        "        return self._capture_graph(graph, None, None, run_once)\n\n\nclass CudaGraphRunner:",
    )
    result = check_tree([root], load_catalog(root))
    line = (root / CG).read_text().splitlines().index("        return self._capture_graph(graph, None, None, run_once)") + 1
    assert [(f.code, f.line, f.col) for f in result.findings] == [("CI301", line, 16)]
    assert "PiecewiseCudaGraphRunner" in result.findings[0].message


def test_calling_model_runner_forward_is_covered_by_the_forward_site(states):
    scheduler = (states["scaffolded"] / "refsgl/srt/managers/scheduler.py").read_text()
    assert "model_runner.forward(" in scheduler  # and the clean test above reports nothing for it


def test_a_site_file_whose_shape_changed_reports_the_role_not_found(states, tmp_path):
    root = broken(states, tmp_path, "scaffolded", MR, "self._forward_raw(forward_batch,", "self._run(forward_batch,")
    # The site is gone, so its placeholder (assignment and with item) is stray, and the
    # graph replay in ModelRunner._forward_raw is no longer in a covered class.
    assert codes(root) == ["CI102", "CI103", "CI103", "CI301"]


def test_findings_point_at_the_offending_line(states, tmp_path):
    root = broken(states, tmp_path, "scaffolded", EW, "canary_index_ctx = contextlib.nullcontext()", "canary_index_ctx = 3")
    result = check_tree([root], load_catalog(root))
    [finding] = result.findings
    line = next(i for i, text in enumerate((root / EW).read_text().splitlines(), 1) if "canary_index_ctx = 3" in text)
    assert (finding.code, finding.line, finding.col) == ("CI105", line, 13)


def test_files_outside_the_catalog_paths_are_checked_for_strays_and_uncovered_forwards(states, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(states["scaffolded"], root)
    (root / "refsgl/srt/model_executor/piecewise_runner.py").write_text(
        "import contextlib\n\n\n"
        "class PiecewiseRunner:\n"
        "    def run(self, forward_batch):\n"
        "        canary_ctx = contextlib.nullcontext()\n"
        "        with canary_ctx:\n"
        "            self.piecewise_graph_runner.replay(forward_batch)\n"
        "        return self.piecewise_graph_runner.replay(forward_batch)\n"
    )
    result = check_tree([root], load_catalog(root))
    # The replay inside the (uncatalogued) bracket is the stray's to report; the one after it is unguarded.
    assert [(f.path.name, f.line, f.code) for f in result.findings] == [
        ("piecewise_runner.py", 6, "CI103"), ("piecewise_runner.py", 7, "CI103"), ("piecewise_runner.py", 9, "CI301"),
    ]
    assert "nothing found in the tree calls PiecewiseRunner.run" in result.findings[2].message
