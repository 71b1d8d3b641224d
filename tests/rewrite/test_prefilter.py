"""The byte-level tests that decide which files check reads past one scan, and which files may call a function."""

from __future__ import annotations

import pytest

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.syntax.naming import head_noun, receiver_fits
from canary_instrument.rewrite.io.callers import CallerSearch
from canary_instrument.rewrite.io.prefilter import REACH, ROLES, SITES, Prefilter


@pytest.fixture(scope="module")
def prefilter() -> Prefilter:
    return Prefilter(load_catalog(None))


@pytest.mark.parametrize("source, needs", [
    (b"x = self.model_runner.model.forward(ids, pos, fb)\n", REACH),
    (b"fwd = self.model_runner.model.forward\n", REACH),  # an alias of the forward
    (b"self._capture(bs, self.model_runner.model.forward)\n", REACH),  # passed on
    (b"# ModelRunner._forward_raw publishes the context\n", 0),  # a comment
    (b'"""Runs in _forward_raw, so the re-plan sees it."""\n', 0),  # a docstring's prose
    (b"canary_ctx = contextlib.nullcontext()\n", SITES | REACH),
    (b"server_args.kv_canary == 'none'\n", 0),  # the word canary alone holds no placeholder
    (b"x = 1\n", 0),
])
def test_what_a_file_outside_the_catalog_paths_needs(prefilter, source, needs):
    assert prefilter.needs("pkg/srt/other.py", source) == needs


def test_a_file_at_a_catalog_path_needs_site_analysis_only_where_a_site_can_be(prefilter):
    path = "pkg/srt/model_executor/runner/eager_runner.py"
    assert prefilter.needs(path, b"class EagerRunner:\n    pass\n") == ROLES
    assert prefilter.needs(path, b"class DecodeCudaGraphRunner(Base):\n    pass\n") == ROLES | SITES | REACH
    assert prefilter.needs(path, b"from x import install_canary\n") == ROLES | SITES | REACH
    # Graph set-up moved out of its class: a module-level function named like a candidate method.
    assert prefilter.needs(path, b"def capture_one_shape(runner, bs):\n    pass\n") == ROLES | SITES | REACH


@pytest.mark.parametrize("receiver, cls, fits", [
    ("get_runner", "MultiLayerEagleDraftExtendCudaGraphRunner", True),
    ("runners", "EagerRunner", True),
    ("cuda_graph_runner", "EagerRunner", False),
    ("cuda_graph_runner_for_draft_extend", "EAGLEDraftExtendCudaGraphRunner", True),
    ("draft_worker", "EagleDraftWorker", True),
    ("state", "CPUGraphRunner", False),
    ("graphs", "BreakableCudaGraphRunner", False),
    ("model", "ModelRunner", False),
    ("connection", "EagerRunner", False),
])
def test_a_receiver_fits_a_class_when_every_word_of_its_name_is_in_the_class_name(receiver, cls, fits):
    assert receiver_fits(receiver, cls) is fits
    assert head_noun("EAGLEDraftCudaGraphRunner") == "runner"


def test_the_caller_search_finds_calls_by_fitting_receivers_constructors_and_subclasses():
    files = [
        b"out = self.model_runner.eager_runner.execute(fb)\n",
        b"rows = connection.execute('select 1')\n",
        b"runner = CPUGraphRunner(model_runner)\n",
        b"from x import CPUGraphRunner  # CPUGraphRunner captures two graphs\n",
        b"class NpuRunner(pkg.DecodeCudaGraphRunner):\n    pass\n",
        b"self.execute(fb)\n",
        b"y = self.runners[i].execute(fb)\n",
    ]
    search = CallerSearch(files)
    wanted = {("call", "execute", "EagerRunner"), ("call", "CPUGraphRunner", None), ("subclass", "DecodeCudaGraphRunner")}
    assert search.find(wanted) == {0, 2, 4, 6}


def test_class_names_sharing_a_part_are_found_as_each_alone():
    # `Runner` is searched for once for the four names: each file is judged as a search per name would.
    files = [
        b"class MyRunner(DecodeCudaGraphRunner):\n    pass\n",  # a subclass
        b"runner = CPUGraphRunner(model_runner)\n",  # a constructor call
        b"x = NotCPUGraphRunner(model_runner)\n",  # a longer name holding the wanted one
        b"from a import EagerRunner  # EagerRunner is not called here\n",
        b"class ModelRunnerMixin(ModelRunner, object):\n    pass\n",
        b"class EagerRunner:\n    pass\n",  # the definition of a wanted class
    ]
    wanted = {("subclass", "DecodeCudaGraphRunner"), ("call", "CPUGraphRunner", None), ("call", "EagerRunner", None),
              ("subclass", "ModelRunner"), ("define", "EagerRunner")}
    together = CallerSearch(files).find(wanted)
    alone = set().union(*(CallerSearch(files).find({entry}) for entry in wanted))
    assert together == alone == {0, 1, 4, 5}
