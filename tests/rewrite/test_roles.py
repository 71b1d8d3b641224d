"""One before/after case per site role and per tricky shape, for scaffold and apply (and revert back)."""

from __future__ import annotations

import pytest

from rewrite_trees import dedent

MR = "pkg/srt/model_executor/model_runner.py"
CG = "pkg/srt/model_executor/cuda_graph_runner.py"
EW = "pkg/srt/speculative/eagle_worker_v2.py"
DE = "pkg/srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


def assert_transform(tree, command, path, before, after):
    tree.write({path: before})
    result = tree.run(command)
    assert result.errors == [] and result.findings == [], [str(x) for x in (*result.errors, *result.findings)]
    assert tree.read(path) == dedent(after)
    return result


def assert_round_trip(tree, path, before, scaffolded, wired):
    """scaffold gives `scaffolded`, apply gives `wired`, revert gives `scaffolded` back, byte for byte."""
    assert_transform(tree, "scaffold", path, before, scaffolded)
    tree.run("apply")
    assert tree.read(path) == dedent(wired)
    tree.run("revert")
    assert tree.read(path) == dedent(scaffolded)


FORWARD_BEFORE = '''
    import contextlib


    class ModelRunner:
        def forward(self, forward_batch):
            step_span_ctx = contextlib.nullcontext()
            with (
                step_span_ctx,
                recorder().with_forward_pass(
                    self.forward_pass_id,
                    forward_batch,
                ) as recorder_outputs,
            ):
                output = self._forward_raw(forward_batch)
            return output
    '''


def test_forward_site_joins_the_multi_item_with_first_and_leaves_other_nullcontexts_alone(tree):
    assert_round_trip(
        tree, MR, FORWARD_BEFORE,
        '''
        import contextlib


        class ModelRunner:
            def forward(self, forward_batch):
                step_span_ctx = contextlib.nullcontext()
                canary_ctx = contextlib.nullcontext()
                with (
                    canary_ctx,
                    step_span_ctx,
                    recorder().with_forward_pass(
                        self.forward_pass_id,
                        forward_batch,
                    ) as recorder_outputs,
                ):
                    output = self._forward_raw(forward_batch)
                return output
        ''',
        '''
        import contextlib

        from canary_instrument.runtime import canary_context


        class ModelRunner:
            def forward(self, forward_batch):
                step_span_ctx = contextlib.nullcontext()
                canary_ctx = self.canary_ctx(forward_batch, outside=[0], active=0)
                with (
                    canary_ctx,
                    step_span_ctx,
                    recorder().with_forward_pass(
                        self.forward_pass_id,
                        forward_batch,
                    ) as recorder_outputs,
                ):
                    output = self._forward_raw(forward_batch)
                return output

            # canary-instrument: generated; `canary-instrument revert` removes it
            def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
                manager = None if self.is_draft_worker else self.canary_manager
                return canary_context(
                    manager, forward_batch, outside=outside, active=active
                )
        ''',
    )


def test_capture_site_wraps_warm_up_through_capture_and_gets_the_draft_worker_guard(tree):
    assert_round_trip(
        tree, CG,
        '''
        import contextlib


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                graph = new_graph()

                def run_once():
                    return forward(bs)

                # Warm up twice before capturing.
                for _ in range(2):
                    run_once()

                pool = get_pool()
                out = self._capture_graph(graph, pool, run_once)  # the capture
                return graph, out
        ''',
        '''
        import contextlib


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                graph = new_graph()

                def run_once():
                    return forward(bs)

                # Warm up twice before capturing.
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    for _ in range(2):
                        run_once()

                    pool = get_pool()
                    out = self._capture_graph(graph, pool, run_once)  # the capture
                return graph, out
        ''',
        '''
        from canary_instrument.runtime import canary_context


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                graph = new_graph()

                def run_once():
                    return forward(bs)

                # Warm up twice before capturing.
                canary_ctx = self.canary_ctx(active=0)
                with canary_ctx:
                    for _ in range(2):
                        run_once()

                    pool = get_pool()
                    out = self._capture_graph(graph, pool, run_once)  # the capture
                return graph, out

            # canary-instrument: generated; `canary-instrument revert` removes it
            def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
                manager = (
                    None
                    if self.model_runner.is_draft_worker
                    else self.model_runner.canary_manager
                )
                return canary_context(
                    manager, forward_batch, outside=outside, active=active
                )
        ''',
    )


EAGLE_BEFORE = '''
    from contextlib import nullcontext


    class EAGLEWorkerV2:
        def __init__(self, args):
            self.draft_runner = make_runner(args)
            self.idle_ctx = nullcontext()
            self.init_cuda_graphs()

        @torch.no_grad()
        def draft(self, batch):
            forward_batch = self.prepare(batch)
            if can_cuda_graph:
                tokens = self.cuda_graph_runner.replay(forward_batch)
            else:
                tokens = self.draft_forward(forward_batch)
            return tokens

        def draft_forward(self, forward_batch):
            for step in range(self.speculative_num_steps):
                with forward_context(forward_batch, step=step):
                    out = self.draft_runner.model.forward(forward_batch)
            return out

        def _draft_extend_for_prefill(self, forward_batch):
            logits_output = self.draft_runner.forward(forward_batch).logits_output
            return logits_output
    '''


def test_eagle_sites_loop_index_aliased_factory_decorators_and_init_finished_hook(tree):
    assert_round_trip(
        tree, EW, EAGLE_BEFORE,
        '''
        from contextlib import nullcontext


        class EAGLEWorkerV2:
            def __init__(self, args):
                self.draft_runner = make_runner(args)
                self.idle_ctx = nullcontext()
                self.init_cuda_graphs()

            @torch.no_grad()
            def draft(self, batch):
                forward_batch = self.prepare(batch)
                canary_outside_ctx = nullcontext()
                with canary_outside_ctx:
                    if can_cuda_graph:
                        tokens = self.cuda_graph_runner.replay(forward_batch)
                    else:
                        tokens = self.draft_forward(forward_batch)
                return tokens

            def draft_forward(self, forward_batch):
                for step in range(self.speculative_num_steps):
                    canary_index_ctx = nullcontext()
                    with forward_context(forward_batch, step=step), canary_index_ctx:
                        out = self.draft_runner.model.forward(forward_batch)
                return out

            def _draft_extend_for_prefill(self, forward_batch):
                canary_ctx = nullcontext()
                with canary_ctx:
                    logits_output = self.draft_runner.forward(forward_batch).logits_output
                return logits_output
        ''',
        '''
        from contextlib import nullcontext

        from canary_instrument.runtime import canary_context, mark_init_finished


        class EAGLEWorkerV2:
            def __init__(self, args):
                self.draft_runner = make_runner(args)
                self.idle_ctx = nullcontext()
                self.init_cuda_graphs()
                mark_init_finished(self.draft_runner.canary_manager)

            @torch.no_grad()
            def draft(self, batch):
                forward_batch = self.prepare(batch)
                canary_outside_ctx = self.canary_ctx(
                    forward_batch, outside=list(range(self.speculative_num_steps - 1))
                )
                with canary_outside_ctx:
                    if can_cuda_graph:
                        tokens = self.cuda_graph_runner.replay(forward_batch)
                    else:
                        tokens = self.draft_forward(forward_batch)
                return tokens

            def draft_forward(self, forward_batch):
                for step in range(self.speculative_num_steps):
                    canary_index_ctx = self.canary_ctx(active=step)
                    with forward_context(forward_batch, step=step), canary_index_ctx:
                        out = self.draft_runner.model.forward(forward_batch)
                return out

            def _draft_extend_for_prefill(self, forward_batch):
                canary_ctx = self.canary_ctx(forward_batch, outside=[0], active=0)
                with canary_ctx:
                    logits_output = self.draft_runner.forward(forward_batch).logits_output
                return logits_output

            # canary-instrument: generated; `canary-instrument revert` removes it
            def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
                manager = self.draft_runner.canary_manager
                return canary_context(
                    manager, forward_batch, outside=outside, active=active
                )
        ''',
    )


def test_install_and_init_finished_hooks_follow_their_anchor_statements(tree):
    # Init finishes at the end of the function that captures, also when graphs are off.
    tree.write({MR: '''
        import contextlib as cl


        class ModelRunner:
            def initialize(self):
                self.load_model()
                self.init_memory_pool(self.server_args.max_total_tokens)
                self.init_attention_backend()
                if self.use_graphs:
                    self.init_device_graphs()

            def forward(self, forward_batch):
                canary_ctx = cl.nullcontext()
                with canary_ctx, cl.suppress(KeyError):
                    return self._forward_raw(forward_batch)
        '''})
    result = tree.run("apply")
    assert result.findings == [] and result.errors == []
    assert tree.read(MR) == dedent('''
        import contextlib as cl

        from canary_instrument.runtime import canary_context, install_canary, mark_init_finished


        class ModelRunner:
            def initialize(self):
                self.load_model()
                self.init_memory_pool(self.server_args.max_total_tokens)
                self.canary_manager = install_canary(
                    server_args=self.server_args, model_runner=self
                )
                self.init_attention_backend()
                if self.use_graphs:
                    self.init_device_graphs()
                mark_init_finished(
                    self.canary_manager if not self.is_draft_worker else None
                )

            def forward(self, forward_batch):
                canary_ctx = self.canary_ctx(forward_batch, outside=[0], active=0)
                with canary_ctx, cl.suppress(KeyError):
                    return self._forward_raw(forward_batch)

            # canary-instrument: generated; `canary-instrument revert` removes it
            def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
                manager = None if self.is_draft_worker else self.canary_manager
                return canary_context(
                    manager, forward_batch, outside=outside, active=active
                )
        ''')
    tree.run("revert")
    assert "install_canary" not in tree.read(MR) and "canary_ctx = cl.nullcontext()" in tree.read(MR)


def test_scaffold_adds_the_contextlib_import_when_the_file_has_none(tree):
    assert_transform(
        tree, "scaffold", DE,
        '''
        class EAGLEDraftExtendCudaGraphRunner:
            def capture_one_batch_size(self, bs, forward):
                forward_batch = self._capture_init(bs)
                out = self._capture_graph(forward_batch)
                return out
        ''',
        '''
        import contextlib
        class EAGLEDraftExtendCudaGraphRunner:
            def capture_one_batch_size(self, bs, forward):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    forward_batch = self._capture_init(bs)
                    out = self._capture_graph(forward_batch)
                return out
        ''',
    )


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
    tree.write({MR: FORWARD_BEFORE})
    tree.run("scaffold")
    once = tree.read(MR)
    assert tree.run("scaffold").changes == [] and tree.read(MR) == once
    tree.run("apply")
    wired = tree.read(MR)
    assert tree.run("apply").changes == [] and tree.read(MR) == wired


def test_apply_refuses_a_site_without_placeholder(tree):
    tree.write({MR: FORWARD_BEFORE})
    result = tree.run("apply")
    # CI102 and CI209 are about the rest of the layout, which this one-file tree does not hold.
    assert [f.code for f in result.findings if f.code not in ("CI102", "CI209")] == ["CI101"]
    assert result.exit_code == 1


def test_diff_mode_writes_nothing(tree):
    tree.write({MR: FORWARD_BEFORE})
    result = tree.run("scaffold", write=False)
    assert tree.read(MR) == dedent(FORWARD_BEFORE)
    assert "+        canary_ctx = contextlib.nullcontext()" in result.changes[0].diff()


def test_apply_skips_a_site_whose_wiring_reads_a_name_the_method_lacks(tree):
    tree.write({EW: """
        import contextlib


        class EAGLEWorkerV2:
            def _draft_extend_for_prefill(self, batch):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    out = self.draft_runner.forward(batch)
                return out
        """})
    result = tree.run("apply")
    findings = [f for f in result.findings if f.code not in ("CI102", "CI209")]  # the rest of the layout
    assert [(f.code, f.line) for f in findings] == [("CI207", 6)]
    assert "forward_batch" in findings[0].message
    assert "self.canary_ctx(" not in tree.read(EW)


def test_extend_decode_site_wraps_graph_replay_and_eager_forward_together(tree):
    assert_transform(
        tree, "scaffold", EW,
        '''
        import contextlib


        class EAGLEWorkerV2:
            def _draft_extend_for_decode(self, forward_batch):
                if self.cuda_graph_runner_for_draft_extend.can_run(forward_batch):
                    out = self.cuda_graph_runner_for_draft_extend.replay(forward_batch)
                else:
                    out = self.draft_runner.forward(forward_batch).logits_output
                return out
        ''',
        '''
        import contextlib


        class EAGLEWorkerV2:
            def _draft_extend_for_decode(self, forward_batch):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    if self.cuda_graph_runner_for_draft_extend.can_run(forward_batch):
                        out = self.cuda_graph_runner_for_draft_extend.replay(forward_batch)
                    else:
                        out = self.draft_runner.forward(forward_batch).logits_output
                return out
        ''',
    )


DRAFT_EXTEND_BEFORE = '''
    """Draft-extend graphs."""

    from __future__ import annotations

    import bisect
    from typing import Callable

    import torch


    class EAGLEDraftExtendCudaGraphRunner:
        def capture_one_batch_size(self, bs, forward):
            forward_batch = self._capture_init(bs)
            out = self._capture_graph(forward_batch)
            return out
    '''


def test_apply_removes_the_contextlib_import_scaffold_added_and_revert_puts_it_back(tree):
    assert_round_trip(
        tree, DE, DRAFT_EXTEND_BEFORE,
        '''
        """Draft-extend graphs."""

        from __future__ import annotations

        import bisect
        import contextlib
        from typing import Callable

        import torch


        class EAGLEDraftExtendCudaGraphRunner:
            def capture_one_batch_size(self, bs, forward):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    forward_batch = self._capture_init(bs)
                    out = self._capture_graph(forward_batch)
                return out
        ''',
        '''
        """Draft-extend graphs."""

        from __future__ import annotations

        import bisect
        from typing import Callable

        import torch
        from canary_instrument.runtime import canary_context


        class EAGLEDraftExtendCudaGraphRunner:
            def capture_one_batch_size(self, bs, forward):
                canary_ctx = self.canary_ctx(active=0)
                with canary_ctx:
                    forward_batch = self._capture_init(bs)
                    out = self._capture_graph(forward_batch)
                return out

            # canary-instrument: generated; `canary-instrument revert` removes it
            def canary_ctx(self, forward_batch=None, *, outside=None, active=None):
                manager = self.model_runner.canary_manager
                return canary_context(
                    manager, forward_batch, outside=outside, active=active
                )
        ''',
    )
    assert tree.run("apply").changes and tree.run("apply").changes == []


def test_apply_keeps_a_contextlib_import_the_file_uses_outside_its_sites(tree):
    tree.write({CG: '''
        import contextlib


        class CudaGraphRunner:
            @contextlib.contextmanager
            def patch(self):
                yield

            def _capture(self, bs, forward):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    out = self._capture_graph(bs, forward)
                return out
        '''})
    tree.run("apply")
    assert tree.read(CG).startswith("import contextlib\n\nfrom canary_instrument.runtime import canary_context\n")


def test_revert_spells_the_placeholder_as_scaffold_once_apply_removed_the_file_s_own_factory_import(tree):
    """Documented limitation (docs/cli.md): apply records nothing, so an aliased factory import that
    only the placeholders used comes back as scaffold's `import contextlib`."""
    tree.write({CG: '''
        from contextlib import nullcontext as nc


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                canary_ctx = nc()
                with canary_ctx:
                    out = self._capture_graph(bs, forward)
                return out
        '''})
    tree.run("apply")
    wired = tree.read(CG)
    assert "nullcontext" not in wired and wired.startswith("from canary_instrument.runtime import canary_context\n")
    tree.run("revert")
    assert tree.read(CG) == dedent('''
        import contextlib


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                canary_ctx = contextlib.nullcontext()
                with canary_ctx:
                    out = self._capture_graph(bs, forward)
                return out
        ''')
    tree.run("apply")
    assert tree.read(CG) == wired


def test_revert_writes_one_spelling_for_every_placeholder_of_a_file(tree):
    """Documented limitation (docs/cli.md): placeholders spelled two ways in one file come back one way."""
    tree.write({EW: '''
        import contextlib
        from contextlib import nullcontext


        class EAGLEWorkerV2:
            def draft(self, forward_batch):
                canary_outside_ctx = contextlib.nullcontext()
                with canary_outside_ctx:
                    tokens = self.cuda_graph_runner.replay(forward_batch)
                return tokens

            def _draft_extend_for_prefill(self, forward_batch):
                canary_ctx = nullcontext()
                with canary_ctx:
                    logits_output = self.draft_runner.forward(forward_batch).logits_output
                return logits_output
        '''})
    tree.run("apply")
    assert "contextlib" not in tree.read(EW)
    tree.run("revert")
    reverted = tree.read(EW)
    assert reverted.startswith("import contextlib\n\n\nclass EAGLEWorkerV2:\n")
    assert reverted.count("= contextlib.nullcontext()") == 2


def test_apply_keeps_a_factory_import_the_module_re_exports(tree):
    tree.write({CG: '''
        from contextlib import nullcontext

        __all__ = ["CudaGraphRunner", "nullcontext"]


        class CudaGraphRunner:
            def _capture(self, bs, forward):
                canary_ctx = nullcontext()
                with canary_ctx:
                    out = self._capture_graph(bs, forward)
                return out
        '''})
    tree.run("apply")
    assert tree.read(CG).startswith("from contextlib import nullcontext\n")
