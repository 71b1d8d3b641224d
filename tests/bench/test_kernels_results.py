"""bench/kernels: RESULTS.md is what write_results.py writes from the committed runs, and every committed run
supplies a table of it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "bench" / "kernels"
spec = importlib.util.spec_from_file_location("bench_kernels_write_results", HERE / "write_results.py")
write_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(write_results)


def test_the_page_is_written_from_the_committed_runs():
    assert write_results.render(*write_results.load()) == (HERE / "RESULTS.md").read_text()


def test_every_file_in_results_is_a_run_the_page_reads():
    read = {*write_results.RUNS, write_results.PLAN_WIDTH, Path(write_results.PLAN_WIDTH).with_suffix(".md").name}
    assert {p.name for p in (HERE / "results").iterdir()} == read


def test_a_run_every_table_of_which_a_newer_run_replaced_is_refused():
    runs, plan_width = write_results.load()
    verify_scaling = dict(runs)["h100_verify_scaling.json"]
    with pytest.raises(SystemExit, match="h100_verify_scaling.json"):
        write_results.render(runs + [("newer.json", verify_scaling)], plan_width)


def test_a_beside_run_says_its_stand_in_ends_with_the_logits_only_when_it_has_the_variant_there():
    import copy

    runs, plan_width = write_results.load()
    page = write_results.render(runs, plan_width)
    assert "then the LM head's logits" in page and "*beside, post at the logits*" in page
    assert "| 1 x 1024 | beside, post at the logits |" in page
    # A run from before the stand-in had its logits: no such variant, and the page does not claim them.
    runs = [(name, copy.deepcopy(run)) for name, run in runs]
    beside = next(run for _, run in runs if "beside" in run)
    beside["beside"] = [r for r in beside["beside"]
                        if "post at the logits" not in r["variant"] and r["variant"] != "forks alone, no pass"]
    page = write_results.render(runs, plan_width)
    assert "LM head" not in page and "post at the logits" not in page


def test_a_beside_run_with_the_forks_alone_says_what_they_are():
    import copy

    runs, plan_width = write_results.load()
    runs = [(name, copy.deepcopy(run)) for name, run in runs]
    beside = next(run for _, run in runs if "beside" in run)
    beside["beside"] = [r for r in beside["beside"] if r["variant"] != "forks alone, no pass"]
    assert "forks alone" not in write_results.render(runs, plan_width)
    beside["beside"].append(dict(beside["beside"][1], variant="forks alone, no pass"))
    page = write_results.render(runs, plan_width)
    assert "*forks alone, no pass*, that placement's forks and join with a one-element store" in page
    assert "| 1 x 1024 | forks alone, no pass |" in page
