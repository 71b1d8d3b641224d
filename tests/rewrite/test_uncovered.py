"""CI301 over the whole tree: a forward path is reported only when some path of calls reaches it outside every site.

Each test writes a small engine-shaped tree (the bundled catalog's paths) and reads the CI301 findings.
"""

from __future__ import annotations

import textwrap

import pytest

from rewrite_trees import Tree

MODEL_RUNNER = """
    import contextlib

    from pkg.srt.runners.eager import EagerRunner


    class ModelRunner:
        def __init__(self):
            self.eager_runner = EagerRunner(self)

        def forward(self, forward_batch):
            canary_ctx = contextlib.nullcontext()
            with canary_ctx, recorder():
                out = self._forward_raw(forward_batch)
                out = self._maybe_retry(out, forward_batch)
            return out

        def _maybe_retry(self, out, forward_batch):
            if out is None:
                out = self._forward_raw(forward_batch)
            return out

        def _forward_raw(self, forward_batch):
            return self.eager_runner.execute(forward_batch)
"""

EAGER = """
    class EagerRunner:
        def __init__(self, model_runner):
            self.model_runner = model_runner

        def execute(self, forward_batch):
            return self._decode(forward_batch)

        def _decode(self, forward_batch):
            return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
"""


def ci301(tree: Tree) -> list[tuple[str, int, str]]:
    result = tree.run("check")
    assert result.errors == []
    return [(f.path.name, f.line, f.message) for f in result.findings if f.code == "CI301"]


@pytest.fixture
def engine(tree: Tree) -> Tree:
    tree.write({
        "pkg/__init__.py": "",
        "pkg/srt/model_executor/model_runner.py": MODEL_RUNNER,
        "pkg/srt/runners/eager.py": EAGER,
    })
    return tree


def test_forwards_reached_only_from_inside_the_forward_site_are_covered(engine):
    # `_forward_raw` runs inside the site, and again from `_maybe_retry`, which only the site calls;
    # the runner's model forward is reached only through them, across files.
    assert ci301(engine) == []


def test_a_second_path_outside_the_site_is_reported_with_the_path(engine):
    warmup = "\n    def warmup(self, forward_batch):\n        return self._forward_raw(forward_batch)\n"
    engine.write({"pkg/srt/model_executor/model_runner.py": textwrap.dedent(MODEL_RUNNER) + warmup})
    found = ci301(engine)
    assert [(name, line) for name, line, _ in found] == [("model_runner.py", 26), ("eager.py", 9)]
    assert "nothing found in the tree calls ModelRunner.warmup" in found[0][2]
    assert "reached from ModelRunner.warmup, which nothing found in the tree calls: ModelRunner.warmup -> " \
           "ModelRunner._forward_raw -> EagerRunner.execute -> EagerRunner._decode" in found[1][2]


def test_a_caller_in_a_file_without_any_trigger_is_found_by_the_caller_search(engine):
    engine.write({"pkg/srt/tools/rerun.py": """
        from pkg.srt.runners.eager import EagerRunner


        def rerun(runner: EagerRunner, forward_batch):
            return runner.execute(forward_batch)


        def query(connection):
            return connection.execute("select 1")
    """})
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
    engine.write({"pkg/srt/tools/jobs.py": """
        def drain(runner, forward_batch):
            return runner.execute(forward_batch)


        class JobRunner:
            def execute(self, forward_batch):
                return forward_batch
    """})
    assert ci301(engine) == []


def test_a_receiver_typed_through_returns_and_fields_reaches_the_class_its_name_ranks_first(tree):
    # `capture.decode.runner`: what a function returns (its annotation), a field of that, a field of
    # that (the base class); among the base's subclasses the attribute's name picks the decode runner.
    tree.write({
        "pkg/__init__.py": "",
        "pkg/srt/model_executor/model_runner.py": """
            import contextlib

            from pkg.srt.runners import capture_graphs


            class ModelRunner:
                def init_graphs(self):
                    capture = capture_graphs(self)
                    self.decode_runner = capture.decode.runner

                def forward(self, forward_batch):
                    canary_ctx = contextlib.nullcontext()
                    with canary_ctx:
                        return self._forward_raw(forward_batch)

                def _forward_raw(self, forward_batch):
                    return self.decode_runner.execute(forward_batch)

                def warmup(self, forward_batch):
                    return self.decode_runner.execute(forward_batch)
        """,
        "pkg/srt/runners.py": """
            from dataclasses import dataclass


            class BaseRunner:
                def execute(self, forward_batch):
                    raise NotImplementedError


            class DecodeGraphRunner(BaseRunner):
                def execute(self, forward_batch):
                    return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


            class PrefillGraphRunner(BaseRunner):
                def execute(self, forward_batch):
                    return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


            @dataclass
            class GraphCapture:
                runner: BaseRunner


            @dataclass
            class Captures:
                decode: GraphCapture
                prefill: GraphCapture


            def capture_graphs(model_runner) -> Captures:
                return Captures(GraphCapture(None), GraphCapture(None))
        """,
    })
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
    tree.write({
        "pkg/__init__.py": "",
        "pkg/srt/speculative/base_worker.py": """
            class BaseSpecWorker:
                @property
                def draft_worker(self):
                    return self._draft_worker
        """,
        "pkg/srt/speculative/eagle_worker.py": """
            import contextlib

            from pkg.srt.speculative.base_worker import BaseSpecWorker


            class EagleDraftWorker:
                def draft(self, forward_batch):
                    canary_ctx = contextlib.nullcontext()
                    with canary_ctx:
                        return self.draft_runner.forward(forward_batch)


            class EagleWorker(BaseSpecWorker):
                def __init__(self):
                    self._draft_worker = EagleDraftWorker()

                def forward_batch_generation(self, forward_batch):
                    return self.draft_worker.draft(forward_batch)
        """,
        "pkg/srt/speculative/mtp_worker.py": """
            from pkg.srt.speculative.eagle_worker import EagleWorker


            class MtpDraftWorker:
                def draft(self, forward_batch):
                    return self.draft_runner.forward(forward_batch)


            class MtpWorker(EagleWorker):
                def __init__(self):
                    self._draft_worker = MtpDraftWorker()

                def forward_batch_generation(self, forward_batch):
                    return self.draft_worker.draft(forward_batch)
        """,
    })
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("mtp_worker.py", 6)
    assert "reached from MtpWorker.forward_batch_generation, which nothing found in the tree calls: " \
           "MtpWorker.forward_batch_generation -> MtpDraftWorker.draft" in message


def test_a_model_runner_s_own_model_forward_outside_its_site_is_reported(engine):
    # An autotune dummy run: in the model runner (the class that calls its raw forward), `self.model`
    # is the model runner's model, whatever the catalog's pattern (`*model_runner.model.forward`) spells.
    autotune = ("\n    def autotune(self, forward_batch):\n"
                "        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)\n")
    engine.write({"pkg/srt/model_executor/model_runner.py": textwrap.dedent(MODEL_RUNNER) + autotune})
    [(name, line, message)] = ci301(engine)
    assert (name, line) == ("model_runner.py", 26)
    assert "`self.model.forward(...)` in ModelRunner.autotune" in message


def test_a_draft_runner_held_under_another_name_is_a_draft_forward(tree):
    # An older EAGLE worker: its draft model runner is the model runner of the worker it builds with the
    # draft flag, held as `draft_model_runner`; calling its forward directly runs the draft model.
    tree.write({"pkg/srt/speculative/eagle_worker.py": """
        from pkg.srt.managers.tp_worker import TpModelWorker


        class EagleWorker:
            def __init__(self, server_args):
                self.draft_worker = TpModelWorker(server_args, is_draft_worker=True)
                self.draft_model_runner = self.draft_worker.model_runner
                self.target_model_runner = server_args.model_runner

            def draft(self, forward_batch):
                self.target_model_runner.forward(forward_batch)
                return self.draft_model_runner.forward(forward_batch)
    """})
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("eagle_worker.py", 12)
    assert "model-runner forward `self.draft_model_runner.forward(...)` in EagleWorker.draft" in message


def test_a_graph_runner_that_never_reaches_a_kv_reading_forward_is_not_reported(tree):
    tree.write({"pkg/srt/multimodal/vit_graph_runner.py": """
        import torch


        class VisionGraphRunner:
            def run(self, x):
                self._capture_graph(x)
                return self.graph.replay()

            def _capture_graph(self, x):
                with torch.cuda.graph(self.graph):
                    for block in self.encoder.layers:
                        x = block(x)
    """})
    assert ci301(tree) == []


def test_a_graph_runner_that_captures_a_kv_reading_forward_is_reported(tree):
    tree.write({"pkg/srt/speculative/mtp_graph_runner.py": """
        import torch


        class MtpGraphRunner:
            def capture(self, forward_batch):
                def run_once():
                    return self.draft_model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

                self._capture_graph(run_once)

            def _capture_graph(self, run_once):
                with torch.cuda.graph(self.graph):
                    run_once()
    """})
    [(name, line, message)] = ci301(tree)
    assert (name, line) == ("mtp_graph_runner.py", 9)
    assert "graph capture/replay `self._capture_graph(...)` in MtpGraphRunner.capture" in message


def test_a_callable_handed_to_code_inside_a_bracket_is_covered(tree):
    tree.write({"pkg/srt/speculative/extend_runner.py": """
        import contextlib


        class ExtendRunner:
            def capture_one_shape(self, forward_batch):
                def run_once():
                    return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    self.backend.capture_one(run_once)
    """})
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
