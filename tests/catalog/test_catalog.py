"""The bundled sglang catalog, user overlays (pyproject and --catalog), and errors that name the bad field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from canary_instrument.catalog import CatalogError, load_catalog

CASES = Path(__file__).parent / "cases"  # the long catalogs the tests write, one file each

SITES = {
    "forward": "canary_ctx",
    "capture": "canary_ctx",
    "draft": "canary_outside_ctx",
    "draft_step": "canary_index_ctx",
    "extend_prefill": "canary_ctx",
    "extend_decode": "canary_ctx",
    "extend_capture": "canary_ctx",
    "dummy_run": "canary_run_ctx",
    # Placed only on an uncovered forward path (a start-up forward no other role describes).
    "warmup": "canary_warmup_ctx",
    "runner_warmup": "canary_warmup_ctx",
}


def test_bundled_catalog_has_the_sites_and_four_hooks_of_the_sglang_series(tmp_path):
    catalog = load_catalog(tmp_path)
    assert {s.role: s.placeholder for s in catalog.sites} == SITES
    assert [h.role for h in catalog.hooks] == ["install", "init_finished", "draft_init_finished", "attach_cache"]
    assert catalog.runtime_module == "canary_instrument.runtime"
    assert catalog.placeholder_factory == "contextlib.nullcontext"
    # Newer trees: the capture roles also have candidates under model_executor/runner/.
    capture = next(s for s in catalog.sites if s.role == "capture")
    assert any(c.matches_path("python/sglang/srt/model_executor/runner/decode_graph_runner.py") for c in capture.candidates)
    # The capture site's class reaches the manager through its model runner, with the draft-worker guard.
    manager = catalog.managers[capture.manager]
    assert (manager.expression, manager.guard) == (
        "self.model_runner.canary_manager", "self.model_runner.is_draft_worker",
    )


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_pyproject_overlay_extends_a_role_and_overrides_the_runtime_module(tmp_path):
    write(tmp_path / "pyproject.toml", (CASES / "pyproject_overlay_extends_capture.toml").read_text())
    (tmp_path / "src").mkdir()
    catalog = load_catalog(tmp_path / "src")  # found by searching upwards
    capture = next(s for s in catalog.sites if s.role == "capture")
    assert [c.path for c in capture.candidates][-1] == "srt/model_executor/piecewise.py"
    assert len(capture.candidates) == 3
    assert catalog.runtime_module == "sglang.srt.kv_canary.api"
    assert len(catalog.sources) == 2


def test_catalog_file_can_replace_the_bundled_catalog(tmp_path):
    own = write(tmp_path / "own.toml", (CASES / "own_catalog_replaces_the_bundled_one.toml").read_text())
    catalog = load_catalog(tmp_path, own)
    assert [s.role for s in catalog.sites] == ["step"] and catalog.hooks == () and catalog.triggers == ()


@pytest.mark.parametrize(
    ("overlay", "field"),
    [
        ('[[sites]]\nrole = "capture"\nshape = "around"\n', "sites[role=capture].shape"),
        ('[[sites]]\nrole = "capture"\nwiring = "self.canary_ctx(active="\n', "sites[role=capture].wiring"),
        ('[[sites]]\nrole = "forward"\ncalls = []\n', "sites[role=forward].calls"),
        ('[[sites]]\nrole = "capture"\ncandidates = [{ path = "x.py", classes = ["A"], methods = ["m"], manager = "nope" }]\n',
         "sites[role=capture].candidates[0].manager"),
        ('[[sites]]\nrole = "capture"\ncandidates = [{ path = "x.py", klass = ["A"] }]\n', "sites[0].candidates[0].klass"),
        ('[[sites]]\nrole = "capture"\nplaceholder = "canary ctx"\n', "sites[role=capture].placeholder"),
        ('runtime_module = "not a module"\n', "runtime_module"),
        ('[[hooks]]\nrole = "install"\nstatement = "if x:"\n', "hooks[role=install].statement"),
        ('sitez = 1\n', "sitez"),
        ('[[sites]]\nplaceholder = "canary_ctx"\n', "sites[0].role"),
        ('[[sites]]\nrole = "draft"\nloop = "yes"\n', "sites[role=draft].loop"),
        ('[[sites]]\nrole = "forward"\nwiring = "self.canary_ctx(active={loop_index})"\n', "sites[role=forward].wiring"),
    ],
)
def test_a_malformed_catalog_names_the_file_and_field(tmp_path, overlay, field):
    bad = tmp_path / "bad.toml"
    bad.write_text(overlay)
    with pytest.raises(CatalogError) as error:
        load_catalog(tmp_path, bad)
    assert f": {field}:" in str(error.value)


def test_invalid_toml_and_a_missing_file_are_catalog_errors(tmp_path):
    (tmp_path / "bad.toml").write_text("[[sites]\n")
    with pytest.raises(CatalogError, match="bad.toml: not valid TOML"):
        load_catalog(tmp_path, tmp_path / "bad.toml")
    with pytest.raises(CatalogError, match="missing.toml: cannot read catalog"):
        load_catalog(tmp_path, tmp_path / "missing.toml")
