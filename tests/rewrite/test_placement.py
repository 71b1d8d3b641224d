"""Roles placed from what the code does, on layouts no catalog location names (issue 20).

Each tree is a small sglang-shaped program with files outside the catalog's candidate paths or attributes
spelled differently: `apply` either wires every site and hook, or exits 1 naming what it could not
place, and `check` reports the same.
"""

import case_files

RUNNER = "pkg/srt/executor/model_runner.py"  # not the catalog's model_executor/
SETUP = "pkg/srt/executor/graph_setup/capture.py"
WORKER = "pkg/srt/speculative/drafter.py"  # not the catalog's eagle_worker_v2.py
SCHEDULER = "pkg/srt/managers/batch_scheduler.py"  # not the catalog's scheduler.py

# The tree every test starts from (one case file, cases/placement/): the files above, in that order.
LAYOUT = case_files.load("placement", "draft_runner_layout_outside_the_catalogs_paths")
MODEL_RUNNER, DRAFT_WORKER = LAYOUT.files[RUNNER], LAYOUT.files[WORKER]


def _wired_tree(tree, worker: str) -> None:
    tree.write({**LAYOUT.files, WORKER: worker})


def test_a_draft_runner_held_under_another_name_is_the_manager_the_wiring_reads(tree):
    _wired_tree(tree, DRAFT_WORKER)
    result = tree.run("apply")
    assert result.findings == [], [str(f) for f in result.findings]
    text = tree.read(WORKER)
    assert "        canary_ctx = self.canary_ctx(forward_batch, outside=[0], active=0)\n" in text
    assert "        manager = self.drafter_runner.canary_manager\n" in text
    assert "        mark_init_finished(self.drafter_runner.canary_manager)\n" in text
    assert "draft_runner" not in text.replace("drafter_runner", "")
    assert tree.run("apply").changes == []  # idempotent: the hook in the class's spelling is recognised
    assert tree.run("check").findings == []
    tree.run("revert")
    assert tree.read(WORKER) == DRAFT_WORKER


def test_a_draft_worker_with_two_model_runners_and_no_draft_flag_is_reported_not_guessed(tree):
    worker = DRAFT_WORKER.replace(
        "        self.drafter_runner = self.worker.model_runner\n",
        "        self.drafter_runner = self.worker.model_runner\n"
        "        self.target_runner = self.target.model_runner\n",
    )
    _wired_tree(tree, worker)
    result = tree.run("apply")
    # Neither attribute can be told to be the draft runner: the placeholder fits no role it could wire.
    assert result.exit_code == 1
    assert tree.codes(result) == [("CI103", 15), ("CI103", 16)]
    assert "self.canary_ctx(" not in tree.read(WORKER)  # nothing that reads an attribute nobody assigns
    assert tree.codes(tree.run("check")) == [("CI103", 15), ("CI103", 16)]


def test_the_draft_flag_tells_the_draft_runner_from_the_target_runner(tree):
    worker = DRAFT_WORKER.replace(
        "        self.worker = worker\n",
        "        self.worker = TpModelWorker(is_draft_worker=True)\n",
    ).replace(
        "        self.drafter_runner = self.worker.model_runner\n",
        "        self.drafter_runner = self.worker.model_runner\n"
        "        self.target_runner = self.target.model_runner\n",
    )
    _wired_tree(tree, worker)
    assert tree.run("apply").findings == []
    assert "        manager = self.drafter_runner.canary_manager\n" in tree.read(WORKER)


def test_hooks_go_where_the_code_puts_them_whatever_the_files_are_called(tree):
    _wired_tree(tree, DRAFT_WORKER)
    result = tree.run("apply")
    assert result.exit_code == 0, [str(f) for f in result.findings]
    # The model runner hands itself to capture code in another folder: its init-finished hook goes there.
    setup = tree.read(SETUP)
    assert setup.index("    model_runner.init_piecewise_graphs()\n") < setup.index("    mark_init_finished(\n")
    assert "model_runner.canary_manager if not model_runner.is_draft_worker else None" in setup
    # The class that builds the prefix cache next to a model runner attaches it, in a file of any name.
    scheduler = tree.read(SCHEDULER)
    assert "        attach_radix_cache(\n            self.tp_worker.model_runner.canary_manager, self.tree_cache\n" in scheduler


def test_a_hook_with_no_place_fails_apply_and_check_naming_the_site_that_needs_it(tree):
    tree.write({RUNNER: MODEL_RUNNER.replace("        capture_model_graphs(self)\n", "")})
    assert tree.codes(tree.run("check")) == [("CI209", 11)]
    assert tree.codes(tree.run("apply", write=False)) == [("CI209", 11)]
    result = tree.run("apply")
    assert result.exit_code == 1
    assert tree.codes(result) == [("CI209", 11)]
    finding = result.findings[0]
    assert finding.path.name == "model_runner.py"
    assert "init_finished hook not placed: the forward site in ModelRunner.forward needs" in finding.message
    assert "captures graphs" in finding.message


def test_a_draft_runner_a_property_returns_is_the_manager_the_wiring_reads(tree):
    """A draft worker that is itself the worker of its runner hands it out through a property
    (sglang 0.5.13's frozen-KV MTP worker: `draft_model_runner` returns `self.model_runner`)."""
    worker = DRAFT_WORKER.replace(
        "        self.drafter_runner = self.worker.model_runner\n",
        "\n    @property\n    def drafter_runner(self):\n        return self.worker.model_runner\n",
    )
    assert worker != DRAFT_WORKER
    _wired_tree(tree, worker)
    result = tree.run("apply")
    assert result.findings == [], [str(f) for f in result.findings]
    text = tree.read(WORKER)
    assert "        manager = self.drafter_runner.canary_manager\n" in text
    assert tree.run("check").findings == []
