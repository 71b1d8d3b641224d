"""scaffold covers every forward path CI301 finds uncovered, by the shape of the code on the path
(rewrite/transforms/cover.py), and apply then wires what it placed: check is clean after both.

The tree: a model runner whose forward site replays a prefill graph runner, and the runner's start-up
forwards outside every site (a compile pass of dummy forwards, then a per-shape capture handing `run_once`
to its backend), all reaching one `_run_forward` that the replay reaches too.
"""

from __future__ import annotations

from rewrite_trees import Tree, dedent

MR = "pkg/srt/model_executor/model_runner.py"
RUNNER = "pkg/srt/model_executor/runner/prefill_graph_runner.py"

MODEL_RUNNER = """
    import contextlib

    from pkg.srt.model_executor.runner.prefill_graph_runner import PrefillGraphRunner


    class ModelRunner:
        def __init__(self):
            self.is_draft_worker = False
            self.prefill_runner = PrefillGraphRunner(self)

        def forward(self, forward_batch):
            canary_ctx = contextlib.nullcontext()
            with canary_ctx:
                return self._forward_raw(forward_batch)

        def _forward_raw(self, forward_batch):
            return self.prefill_runner.replay(forward_batch)
"""

PREFILL_RUNNER = """
    class PrefillGraphRunner:
        def __init__(self, model_runner):
            self.model_runner = model_runner
            self.backend = model_runner.backend
            self._compile_pass()
            self.capture()

        def _compile_pass(self):
            for num_tokens in (16, 32):
                self._run_dummy_forward(num_tokens)

        def _run_dummy_forward(self, num_tokens):
            forward_batch = self.prepare(num_tokens)
            self._run_forward(forward_batch)

        def _run_forward(self, forward_batch):
            return self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        def capture(self):
            for num_tokens in (16, 32):
                self.capture_one_shape(num_tokens)

        def capture_one_shape(self, num_tokens):
            forward_batch = self.prepare(num_tokens)

            def run_once():
                return self._run_forward(forward_batch)

            self.backend.capture_one(num_tokens, run_once)

        def replay(self, forward_batch):
            return self._run_forward(forward_batch)
"""


def ci301(tree: Tree) -> list[tuple[str, int]]:
    return [(f.path.name, f.line) for f in tree.run("check").findings if f.code == "CI301"]


def engine(tree: Tree, runner: str = PREFILL_RUNNER) -> Tree:
    tree.write({"pkg/__init__.py": "", MR: MODEL_RUNNER, RUNNER: runner})
    return tree


def test_the_start_up_forwards_are_reported_before_scaffold(tree):
    assert ci301(engine(tree)) == [("prefill_graph_runner.py", 17)]


def test_scaffold_brackets_the_capture_and_the_compile_pass_where_only_start_up_reaches_them(tree):
    result = engine(tree).run("scaffold")
    assert [f.code for f in result.findings] == []
    # The capture hands `run_once` to its backend: a `capture` site around that call. The compile pass
    # reaches `_run_forward` too, which the replay also runs inside the forward site: its site goes one
    # step up, around the dummy forward (`warmup`, a start-up forward no other role describes).
    expected = "import contextlib\n" + dedent(PREFILL_RUNNER).replace(
        "        self._run_forward(forward_batch)\n\n",
        "        canary_warmup_ctx = contextlib.nullcontext()\n"
        "        with canary_warmup_ctx:\n"
        "            self._run_forward(forward_batch)\n\n",
    ).replace(
        "        self.backend.capture_one(num_tokens, run_once)\n",
        "        canary_ctx = contextlib.nullcontext()\n"
        "        with canary_ctx:\n"
        "            self.backend.capture_one(num_tokens, run_once)\n",
    )
    assert tree.read(RUNNER) == expected
    assert ci301(tree) == []


def test_apply_wires_the_placed_sites_and_check_is_clean(tree):
    engine(tree).run("scaffold")
    tree.run("apply")
    wired = tree.read(RUNNER)
    assert "canary_warmup_ctx = self.canary_ctx(active=0)" in wired
    assert "canary_ctx = self.canary_ctx(active=0)" in wired
    assert "manager = None if self.model_runner.is_draft_worker else self.model_runner.canary_manager" in wired
    assert [f.code for f in tree.run("check").findings if f.code not in ("CI102",)] == []
    assert tree.run("apply").changes == []
    tree.run("revert")
    assert "canary_warmup_ctx = contextlib.nullcontext()" in tree.read(RUNNER)


def test_a_capture_the_forward_site_also_runs_is_bracketed_where_only_start_up_reaches_it(tree):
    # A replay that recaptures: the capture runs inside the forward site's active sub-forward too, where a
    # capture site would nest (the runtime refuses that). Its site goes to the constructor instead.
    recapture = PREFILL_RUNNER.replace(
        "        def replay(self, forward_batch):\n",
        "        def replay(self, forward_batch):\n            if self.stale:\n                self.capture()\n")
    engine(tree, recapture).run("scaffold")
    scaffolded = tree.read(RUNNER)
    assert "        self._compile_pass()\n" \
           "        canary_warmup_ctx = contextlib.nullcontext()\n" \
           "        with canary_warmup_ctx:\n" \
           "            self.capture()\n" in scaffolded
    assert "canary_ctx = contextlib.nullcontext()\n        with canary_ctx:\n            self.backend" not in scaffolded
    assert ci301(tree) == []


def test_a_forward_no_role_can_be_placed_on_stays_loud(tree):
    # A forward that nothing in the tree calls, in a class that reaches no manager: scaffold and check
    # both report it.
    tree.write({"pkg/srt/tools/probe.py": dedent("""
        def probe(model_runner, forward_batch):
            return model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
    """)})
    engine(tree)
    result = tree.run("scaffold")
    assert [(f.code, f.path.name) for f in result.findings] == [("CI301", "probe.py")]
    assert ci301(tree) == [("probe.py", 2)]
