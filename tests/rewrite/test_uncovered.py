"""CI301 over the whole tree: a forward path is reported only when some path of calls reaches it outside every site.

Each test writes a small engine-shaped tree (the bundled catalog's paths; the long ones are case files in
cases/uncovered/, case_files.py says their form) and reads the CI301 findings.
"""

from __future__ import annotations

import pytest

import case_files
from rewrite_trees import Tree

ENGINE = case_files.load("uncovered", "engine_forward_reached_through_a_runner_in_another_file")
MODEL_RUNNER = ENGINE.files["pkg/srt/model_executor/model_runner.py"]
EAGER = ENGINE.files["pkg/srt/runners/eager.py"]  # test_cache builds on the same engine


def ci301(tree: Tree) -> list[tuple[str, int, str]]:
    result = tree.run("check")
    assert result.errors == []
    return [(f.path.name, f.line, f.message) for f in result.findings if f.code == "CI301"]


@pytest.fixture
def engine(tree: Tree) -> Tree:
    tree.write(case_files.files("uncovered", ENGINE.name))
    return tree


def test_forwards_reached_only_from_inside_the_forward_site_are_covered(engine):
    # `_forward_raw` runs inside the site, and again from `_maybe_retry`, which only the site calls;
    # the runner's model forward is reached only through them, across files.
    assert ci301(engine) == []


def test_a_second_path_outside_the_site_is_reported_with_the_path(engine):
    warmup = "\n    def warmup(self, forward_batch):\n        return self._forward_raw(forward_batch)\n"
    engine.write({"pkg/srt/model_executor/model_runner.py": MODEL_RUNNER + warmup})
    found = ci301(engine)
    assert [(name, line) for name, line, _ in found] == [("model_runner.py", 26), ("eager.py", 9)]
    assert "nothing found in the tree calls ModelRunner.warmup" in found[0][2]
    assert "reached from ModelRunner.warmup, which nothing found in the tree calls: ModelRunner.warmup -> " \
           "ModelRunner._forward_raw -> EagerRunner.execute -> EagerRunner._decode" in found[1][2]


def test_a_caller_in_a_file_without_any_trigger_is_found_by_the_caller_search(engine):
    engine.write(case_files.files("uncovered", "caller_in_a_file_without_any_trigger"))
    [(name, line, message)] = ci301(engine)
    assert (name, line) == ("eager.py", 9)
    assert "reached from rerun.rerun, which nothing found in the tree calls: rerun.rerun -> EagerRunner.execute" \
        in message


def test_a_call_on_an_object_whose_name_fits_no_runner_does_not_reach_it(engine):
    engine.write({"pkg/srt/tools/query.py": """
        def query(connection, state):
            state.execute()
            return connection.execute("select 1")
    """})
    assert ci301(engine) == []


def test_an_untyped_receiver_is_not_resolved_by_its_name_alone(engine):
    # `runner` fits EagerRunner by name, but nothing shows it holds one: an unrelated `execute` (a job
    # queue's) reaches no runner, so the runner's forward stays covered by the forward site.
    engine.write(case_files.files("uncovered", "untyped_receiver_named_like_a_runner"))
    assert ci301(engine) == []


def test_a_receiver_typed_through_returns_and_fields_reaches_the_class_its_name_ranks_first(tree):
    # `capture.decode.runner`: what a function returns (its annotation), a field of that, a field of
    # that (the base class); among the base's subclasses the attribute's name picks the decode runner.
    tree.write(case_files.files("uncovered", "receiver_typed_through_returns_and_fields"))
    found = ci301(tree)
    # The decode runner's forward, which `warmup` reaches outside the site; the prefill runner's, which
    # nothing calls (an entry point of its own).
    assert [(name, line) for name, line, _ in found] == [("runners.py", 11), ("runners.py", 16)]
    assert "reached from ModelRunner.warmup, which nothing found in the tree calls: ModelRunner.warmup -> " \
           "DecodeGraphRunner.execute" in found[0][2]
    assert "nothing found in the tree calls PrefillGraphRunner.execute" in found[1][2]


def test_the_path_a_finding_shows_goes_through_the_caller_that_holds_the_class(tree):
    # Both workers call `self.draft_worker.draft(...)` through their base's property; only the MTP
    # worker's draft worker is the MTP one, so the path shown is the MTP worker's (each hop a call the
    # code makes on an object it holds), not the EAGLE worker's.
    tree.write(case_files.files("uncovered", "path_through_the_caller_that_holds_the_class"))
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("mtp_worker.py", 6)
    assert "reached from MtpWorker.forward_batch_generation, which nothing found in the tree calls: " \
           "MtpWorker.forward_batch_generation -> MtpDraftWorker.draft" in message


def test_a_model_runner_s_own_model_forward_outside_its_site_is_reported(engine):
    # An autotune dummy run: in the model runner (the class that calls its raw forward), `self.model`
    # is the model runner's model, whatever the catalog's pattern (`*model_runner.model.forward`) spells.
    autotune = ("\n    def autotune(self, forward_batch):\n"
                "        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)\n")
    engine.write({"pkg/srt/model_executor/model_runner.py": MODEL_RUNNER + autotune})
    [(name, line, message)] = ci301(engine)
    assert (name, line) == ("model_runner.py", 26)
    assert "`self.model.forward(...)` in ModelRunner.autotune" in message


def test_a_draft_runner_held_under_another_name_is_a_draft_forward(tree):
    # An older EAGLE worker: its draft model runner is the model runner of the worker it builds with the
    # draft flag, held as `draft_model_runner`; calling its forward directly runs the draft model.
    tree.write(case_files.files("uncovered", "draft_runner_held_under_another_name"))
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("eagle_worker.py", 12)
    assert "model-runner forward `self.draft_model_runner.forward(...)` in EagleWorker.draft" in message


def test_a_graph_runner_that_never_reaches_a_kv_reading_forward_is_not_reported(tree):
    tree.write(case_files.files("uncovered", "graph_runner_without_a_kv_reading_forward"))
    assert ci301(tree) == []


def test_a_graph_runner_that_captures_a_kv_reading_forward_is_reported(tree):
    tree.write(case_files.files("uncovered", "graph_runner_capturing_a_kv_reading_forward"))
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("mtp_graph_runner.py", 9)
    assert "graph capture/replay `self._capture_graph(...)` in MtpGraphRunner.capture" in message


def test_a_callable_handed_to_code_inside_a_bracket_is_covered(tree):
    tree.write(case_files.files("uncovered", "callable_handed_to_code_inside_a_bracket"))
    result = tree.run("check")
    # The bracket is a capture site by its shape (it guards `capture_one`, its class reaches
    # `self.model_runner`), so the forward handed to it is covered: no CI301, and no stray (CI209: the
    # model runner's install and init-finished hooks, which this one-file tree does not hold).
    assert [f.code for f in result.findings if f.code != "CI209"] == []


def test_module_level_code_is_an_entry_point(tree):
    tree.write({"pkg/srt/tools/smoke.py": """
        from pkg.srt.tools.helpers import run


        run(None)
    """, "pkg/srt/tools/helpers.py": """
        def run(model_runner):
            return model_runner.model.forward(None, None, None)
    """})
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("helpers.py", 2)
    assert "reached from module-level code of smoke: helpers.run" in message


@pytest.mark.parametrize("case", [
    "receiver_typed_through_returns_and_fields", "graph_runner_capturing_a_kv_reading_forward",
    "path_through_the_caller_that_holds_the_class", "draft_runner_held_under_another_name",
])
def test_a_graph_that_takes_files_in_round_by_round_is_the_graph_of_all_of_them(tree, case):
    # The caller search adds each round's files to the graph it built before (`CallGraph.add`): what CI301
    # reads from it (the calls resolved both ways, the findings, what a search must look for) is what the
    # graph of all the files built at once gives, whichever files came first.
    from canary_instrument.catalog import load_catalog
    from canary_instrument.rewrite.analysis.callgraph import CallGraph
    from canary_instrument.rewrite.analysis.reach import reach_facts
    from canary_instrument.rewrite.analysis.tree import parse_source, split_lines
    from canary_instrument.rewrite.io.files import read_source
    from canary_instrument.rewrite.rules.ci301_uncovered_forward import callers_wanted, uncovered_findings

    tree.write(case_files.files("uncovered", ENGINE.name))
    tree.write(case_files.files("uncovered", case))
    catalog = load_catalog(tree.root)
    files = []
    for path in sorted(tree.root.rglob("*.py")):
        source = read_source(path)
        files.append((path, reach_facts(path, parse_source(source), split_lines(source.text), [], catalog)))

    def read(graph):
        return (graph.callees, dict(graph.callers), graph.weak, callers_wanted(graph),
                uncovered_findings(files, catalog, graph))

    whole = read(CallGraph(files))
    assert whole[4], "the case reports a forward: the graphs compared hold one"
    for split in range(1, len(files)):
        graph = CallGraph(files[:split])
        graph.add(files[split:])
        assert read(graph) == whole
