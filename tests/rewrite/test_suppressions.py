"""Acknowledging a finding the ruff way: `# noqa: CIxxx`, a bare `# noqa`, `ignore` and `per-file-ignores`, and
CI401 for a `# noqa` code that silences nothing (ruff's RUF100).

The tree is the engine of test_uncovered.py with a warm-up method that runs the raw forward outside the forward
site: CI301 at its `_forward_raw` call (model_runner.py:26) and at the eager runner's forward (eager.py:9). The
small tree holds none of the other roles the catalog expects at its paths (CI102), left out here.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import case_files
from canary_instrument.cli import main
from rewrite_trees import Tree

ENGINE = case_files.load("uncovered", "engine_forward_reached_through_a_runner_in_another_file")
MODEL_RUNNER = ENGINE.files["pkg/srt/model_executor/model_runner.py"]
EAGER = ENGINE.files["pkg/srt/runners/eager.py"]
WARMUP = "\n    def warmup(self, forward_batch):\n        return self._forward_raw(forward_batch){}\n"


def engine(tree: Tree, comment: str = "", eager: str = EAGER) -> Tree:
    tree.write(case_files.files("uncovered", ENGINE.name))
    tree.write({"pkg/srt/model_executor/model_runner.py": MODEL_RUNNER + WARMUP.format(comment),
                "pkg/srt/runners/eager.py": eager})
    return tree


def eager_with(comment: str) -> str:
    lines = EAGER.split("\n")
    lines[8] += comment  # line 9: the model forward
    return "\n".join(lines)


def found(tree: Tree) -> list[tuple[str, str, int]]:
    result = tree.run("check")
    assert result.errors == []
    return [(f.code, f.path.name, f.line) for f in result.findings if f.code in ("CI301", "CI401")]


def test_without_acknowledgement_both_forwards_are_reported(tree):
    assert found(engine(tree)) == [("CI301", "model_runner.py", 26), ("CI301", "eager.py", 9)]


@pytest.mark.parametrize("comment", ["  # noqa: CI301", "  # NOQA:CI301", "  # noqa: E501, CI301", "  # noqa"])
def test_a_noqa_naming_the_code_or_a_bare_noqa_silences_the_finding_on_its_line(tree, comment):
    assert found(engine(tree, comment)) == [("CI301", "eager.py", 9)]


def test_a_noqa_naming_another_code_silences_nothing_and_is_reported_unused(tree):
    result = engine(tree, "  # noqa: CI106").run("check")
    ours = [f for f in result.findings if f.path.name == "model_runner.py" and f.code in ("CI301", "CI401")]
    assert [(f.code, f.line, f.col) for f in ours] == [("CI301", 26, 16), ("CI401", 26, 50)]
    assert "`# noqa: CI106` silences no CI106 finding on this line; remove it" in ours[1].message


def test_a_noqa_code_that_silences_nothing_is_reported_and_other_tools_codes_are_left_alone(tree):
    engine(tree, "  # noqa: CI301")
    tree.write({"pkg/srt/utils.py": "import os  # noqa: F401, CI101\nimport sys  # noqa\n"})
    assert found(tree) == [("CI301", "eager.py", 9), ("CI401", "utils.py", 1)]


def test_a_reviewed_finding_that_went_away_leaves_its_acknowledgement_reported(tree):
    engine(tree, eager=eager_with("  # noqa: CI301"))
    assert found(tree) == [("CI301", "model_runner.py", 26)]
    # The warm-up goes: the eager forward is covered again, and its `# noqa` now silences nothing.
    tree.write({"pkg/srt/model_executor/model_runner.py": MODEL_RUNNER})
    assert found(tree) == [("CI401", "eager.py", 9)]


def test_ignore_and_per_file_ignores_in_pyproject(tree):
    engine(tree)
    tree.write({"pyproject.toml": """
        [tool.canary-instrument.per-file-ignores]
        "runners/eager.py" = ["CI301"]
    """})
    assert found(tree) == [("CI301", "model_runner.py", 26)]
    tree.write({"pyproject.toml": '[tool.canary-instrument]\nignore = ["CI301"]\n'})
    assert found(tree) == []
    assert [f.code for f in tree.run("check").findings if f.code == "CI102"]  # other codes still reported


def test_a_malformed_ignore_names_the_file_and_field(tree):
    engine(tree)
    tree.write({"pyproject.toml": '[tool.canary-instrument]\nignore = ["E501"]\n'})
    result = CliRunner().invoke(main, ["check", "--no-cache", str(tree.root)])
    assert result.exit_code == 2
    assert "pyproject.toml" in result.output and "ignore: expected a list of finding codes" in result.output


def test_exit_codes_follow_what_is_left(tree):
    engine(tree, "  # noqa: CI301", eager=eager_with("  # noqa: CI301"))
    tree.write({"pyproject.toml": '[tool.canary-instrument]\nignore = ["CI102"]\n'})
    clean = CliRunner().invoke(main, ["check", "--no-cache", str(tree.root)])
    assert (clean.exit_code, clean.output) == (0, "")
    tree.write({"pkg/srt/utils.py": "X = 1  # noqa: CI301\n"})
    stale = CliRunner().invoke(main, ["check", "--no-cache", "--format", "json", str(tree.root)])
    assert stale.exit_code == 1 and '"code": "CI401"' in stale.output


def test_directives_are_numbered_as_findings_are_even_past_a_form_feed():
    from canary_instrument.rewrite.suppressions import noqa_directives

    # str.splitlines would count the form feed as a line break and put the directive on line 3.
    assert noqa_directives("x = 1\x0c\ny = 2  # noqa: CI301, e501\n") == {2: (8, frozenset({"CI301", "E501"}))}
