"""Properties over generated site files (black's habit: checks that need no expected output).

scaffold is AST-equivalent to its input once its wrappers are removed (checked here with an
independent unwrapper, not the tool's own), scaffold and apply are idempotent, and revert and
apply invert each other byte for byte; across indentation styles, newlines and contextlib
import spellings.
"""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canary_instrument.catalog import load_catalog
from canary_instrument.rewrite.transforms.revert import revert_tree
from canary_instrument.rewrite.transforms.scaffold import scaffold_tree
from canary_instrument.rewrite.transforms.apply import apply_tree

MR = "srt/model_executor/model_runner.py"
CG = "srt/model_executor/cuda_graph_runner.py"
CANARY = {"canary_ctx", "canary_outside_ctx", "canary_index_ctx"}

FILLER = [
    "x = compute(a, b)",
    "self.counter += 1",
    "# a comment about the next line",
    "",
    "if flag:\n{i}log('flag set')",
    "for k in range(3):\n{i}total += k",
    "result = [v * 2 for v in values]  # trailing comment",
    "assert_ready(self)",
]
IMPORTS = {
    "plain": ("import contextlib", "contextlib.nullcontext()"),
    "alias": ("import contextlib as cl", "cl.nullcontext()"),
    "from": ("from contextlib import nullcontext", "nullcontext()"),
    "none": ("import os", None),
}


def block(lines: list[str], depth: int, unit: str) -> list[str]:
    out = []
    for line in lines:
        for part in line.format(i=unit).split("\n"):
            out.append(unit * depth + part if part else "")
    return out


@st.composite
def site_files(draw):
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    import_line, span = IMPORTS[draw(st.sampled_from(sorted(IMPORTS)))]
    filler = st.lists(st.sampled_from(FILLER), max_size=3)
    multi_line_with = draw(st.booleans())
    span_expr = span or "other_context()"

    runner = [import_line, "", "", "class ModelRunner:"]
    runner += block(["def initialize(self):"], 1, unit)
    runner += block(draw(filler) + ["self.init_memory_pool(self.size)"] + draw(filler) + ["self.init_device_graphs()"], 2, unit)
    runner += [""] + block(["def forward(self, forward_batch):"], 1, unit)
    runner += block(draw(filler) + [f"step_span_ctx = {span_expr}"], 2, unit)
    if multi_line_with:
        runner += block(["with (", f"{unit}step_span_ctx,", f"{unit}recorder(forward_batch) as out,", "):"], 2, unit)
    else:
        runner += block(["with step_span_ctx, recorder(forward_batch) as out:"], 2, unit)
    runner += block(draw(filler) + ["output = self._forward_raw(forward_batch)"], 3, unit)
    runner += block(["return output"], 2, unit)

    graphs = [import_line, "", "", "class CudaGraphRunner:"]
    # Whether the graph runner's own code (not only its placeholders) uses the factory import.
    factory_used_elsewhere = span is not None and draw(st.booleans())
    if factory_used_elsewhere:
        graphs += block(["def idle(self):", f"{unit}return {span}", ""], 1, unit)
    graphs += block(["def _capture(self, bs, forward):"], 1, unit)
    graphs += block(draw(filler) + ["for _ in range(2):", f"{unit}run_once()"] + draw(filler), 2, unit)
    graphs += block(["out = self._capture_graph(graph, pool, run_once)"] + draw(filler) + ["return graph, out"], 2, unit)
    files = {MR: newline.join(runner) + newline, CG: newline.join(graphs) + newline}
    # revert can only bring back scaffold's own `import contextlib` once apply removed the one
    # the placeholders alone used (docs/cli.md, "What revert restores").
    respelled = span is not None and import_line != "import contextlib" and not factory_used_elsewhere
    return files, (import_line, span) if respelled else None


class Unwrap(ast.NodeTransformer):
    """Remove canary placeholders: their assignments, single-item `with` wrappers and with items."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                setattr(node, name, [s for stmt in statements for s in self.unwrap(stmt)])
        return node

    def unwrap(self, stmt):
        if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", None) in CANARY:
            return []
        if isinstance(stmt, ast.With):
            kept = [i for i in stmt.items if getattr(i.context_expr, "id", None) not in CANARY]
            if not kept:
                return stmt.body
            stmt.items = kept
        if isinstance(stmt, ast.Import) and [a.name for a in stmt.names] == ["contextlib"] and not stmt.names[0].asname:
            return []
        return [stmt]


def unwrapped(text: str) -> str:
    return ast.dump(Unwrap().visit(ast.parse(text)))


def run(root: Path, transform) -> dict[str, bytes]:
    result = transform([root], load_catalog(root))
    assert result.errors == [] and result.findings == [], [str(x) for x in (*result.errors, *result.findings)]
    return {rel: (root / rel).read_bytes() for rel in (MR, CG)}


PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(site_files())
def test_scaffold_is_a_no_op_modulo_wrappers_and_apply_revert_invert_each_other(generated):
    files, respelled = generated
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(text.encode())

        scaffolded = run(root, scaffold_tree)
        for rel, text in files.items():
            assert scaffolded[rel] != text.encode(), f"scaffold left {rel} without placeholder"
            assert unwrapped(scaffolded[rel].decode()) == unwrapped(text)
            newline = "\r\n" if "\r\n" in text else "\n"
            assert scaffolded[rel].decode().count(newline) >= text.count(newline)
        assert run(root, scaffold_tree) == scaffolded  # idempotent

        wired = run(root, apply_tree)
        assert all(b"self.canary_ctx(" in data for data in wired.values())
        for rel, data in wired.items():
            made_unused = set(unused_imports(data.decode())) - set(unused_imports(files[rel]))
            assert made_unused == set(), f"apply left imports it made unused in {rel}"
        assert run(root, apply_tree) == wired  # idempotent
        expected = dict(scaffolded)
        if respelled:
            import_line, span = respelled
            expected[CG] = expected[CG].replace(import_line.encode(), b"import contextlib").replace(
                span.encode(), b"contextlib.nullcontext()"
            )
        assert run(root, revert_tree) == expected  # revert . apply = identity (up to the documented respelling)
        assert run(root, apply_tree) == wired  # apply . revert = identity


def unused_imports(text: str) -> list[str]:
    """Imported names the module never reads (what a linter's unused-import rule reports)."""
    tree = ast.parse(text)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    bound = [
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    return [name for name in bound if name not in read]
