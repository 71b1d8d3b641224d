"""bench/sglang_server/profile_step.py: the per-step summary of a torch profiler trace, on a trace built here."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "bench" / "sglang_server"
spec = importlib.util.spec_from_file_location("bench_sglang_server_profile_step", HERE / "profile_step.py")
profile_step = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = profile_step
spec.loader.exec_module(profile_step)

SCHED = {"pid": 1, "tid": 7}


def ev(cat, name, ts, dur, args=None, **where):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **(where or SCHED), "args": args or {}}


def decode_steps(n=4, step=1000.0):
    """n decode steps of `step` us on the scheduler thread: a site entry (canary frame with a nested one),
    the graph launch, a site exit that launches one kernel and once reads a value back; the canary's kernel
    runs inside each graph replay (the replay's kernels carry its launch's correlation id); then the canary's
    sample wrapper around the engine's sampler (whose launch is the engine's) and its one copy."""
    events = []
    for i in range(n + 1):
        t = i * step
        events += [
            ev("python_function", "canary_instrument/runtime/setup/sites.py(140): __enter__", t, 6),
            ev("python_function", "canary_instrument/runtime/step/steps.py(45): end", t + 1, 2),
            ev("python_function", "sglang/srt/model_executor/model_runner.py(1390): forward", t + 7, 40),
            ev("cuda_runtime", "cudaGraphLaunch", t + 10, 8, args={"correlation": 1000 + i}),
            ev("python_function", "canary_instrument/runtime/setup/sites.py(206): __exit__", t + 50, 10),
            ev("cuda_runtime", "cudaLaunchKernel", t + 52, 3),
            ev("cuda_runtime", "cudaLaunchKernel", t + 70, 3),  # the engine's own, outside canary frames
            ev("kernel", "canary_pre_forward", t + 100, 4, pid=0, tid=3, args={"correlation": 1000 + i}),
            ev("kernel", "flash_decode", t + 110, 300, pid=0, tid=3, args={"correlation": 1000 + i}),
            ev("python_function", "canary_instrument/runtime/step/expected_tokens.py(115): sample", t + 80, 30),
            ev("python_function", "sglang/srt/model_executor/model_runner.py(2900): sample", t + 81, 20),
            ev("cuda_runtime", "cudaLaunchKernel", t + 85, 3, args={"correlation": 10 * i}),  # the sampler's
            ev("cuda_runtime", "cudaLaunchKernel", t + 104, 3, args={"correlation": 10 * i + 1}),  # the copy
            ev("kernel", "argmax_kernel", t + 420, 5, pid=0, tid=3, args={"correlation": 10 * i}),
            ev("kernel", "elementwise_kernel", t + 426, 2, pid=0, tid=3, args={"correlation": 10 * i + 1}),
        ]
        if i == 1:
            events.append(ev("cpu_op", "aten::item", t + 55, 4))
            events.append(ev("cpu_op", "aten::_local_scalar_dense", t + 55.5, 3))
            events.append(ev("cuda_runtime", "cudaStreamSynchronize", t + 56, 2))
    events.append(ev("cuda_runtime", "cudaGraphLaunch", 0.5, 8, pid=1, tid=9))  # another thread, once
    return events


def test_the_summary_counts_the_canarys_outermost_frames_and_what_they_send_to_the_device(tmp_path):
    path = tmp_path / "x-TP-0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": decode_steps()}, f)
    s = profile_step.analyse(profile_step.load_events(path))
    assert s["steps"] == 4 and s["step_us"] == 1000.0
    # __enter__ 6 (its nested `end` inside it) + __exit__ 10 + the sample wrapper 30 less the sampler's 20
    assert s["canary_host_us"] == 26.0
    assert s["canary_device_us"] == 4.0 + 2.0  # its kernel in the graph, and the copy its code launched
    assert s["device_busy_us"] == 4 + 300 + 5 + 2
    assert s["graph_us"] == 110 + 300 - 100  # the replay's first kernel to its last; the sampler's are not in it
    assert s["canary_kernels_per_step"] == {"canary_pre_forward": {"launches": 1.0, "us": 4.0},
                                            "elementwise_kernel": {"launches": 1.0, "us": 2.0}}
    # The exit's launch and the copy's; the sampler's, inside the canary's wrapper, is the engine's.
    assert s["calls_in_canary_frames"]["cudaLaunchKernel"] == {"per_step": 2, "us_per_step": 6.0, "total": 8}
    assert s["calls_in_canary_frames"]["aten::_local_scalar_dense"]["total"] == 1  # one read, not aten::item too
    assert "aten::item" not in s["calls_in_canary_frames"]
    assert "cudaGraphLaunch" not in s["calls_in_canary_frames"]  # the engine's, between the canary's frames
    assert s["syncs_per_step"] == 0  # one step of four read a value back: the median step does not
    # Every kernel, the engine's too, the longest first.
    assert list(s["kernels_per_step"]) == ["flash_decode", "argmax_kernel", "canary_pre_forward", "elementwise_kernel"]
    assert s["kernels_per_step"]["flash_decode"] == {"launches": 1.0, "us": 300.0}
    top = s["top_functions_us_per_step"]
    assert list(top)[:2] == ["canary_instrument/runtime/step/expected_tokens.py(115): sample",
                             "canary_instrument/runtime/setup/sites.py(206): __exit__"]


def test_a_pass_beside_the_forward_adds_device_busy_time_but_not_graph_time():
    # Ours' post pass runs inside the replay beside the attention kernel: the device is busier by its 25 us, the
    # graph takes as long as canary off's. In line after it, the graph is 25 us longer.
    def with_post(start):
        events = decode_steps()
        for i in range(5):
            events.append(ev("kernel", "canary_post_forward", i * 1000.0 + start, 25, pid=0, tid=4,
                             args={"correlation": 1000 + i}))
        return profile_step.analyse(events)

    off = profile_step.analyse(decode_steps())
    beside, in_line = with_post(300), with_post(410)
    assert beside["device_busy_us"] == off["device_busy_us"] + 25 == in_line["device_busy_us"]
    assert beside["graph_us"] == off["graph_us"] == 310
    assert in_line["graph_us"] == 335


def test_a_trace_without_two_graph_replays_is_refused():
    with pytest.raises(ValueError, match="cudaGraphLaunch"):
        profile_step.analyse([ev("cuda_runtime", "cudaGraphLaunch", 0, 5)])


def load_report():
    spec = importlib.util.spec_from_file_location("bench_sglang_server_report_p", HERE / "report.py")
    report = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = report
    spec.loader.exec_module(report)
    return report


def profile_page(tmp_path, summaries: dict, suite: str = "profile") -> list[str]:
    """report.py's section for a profile suite over gpu.sh's archive of ``summaries`` (way -> trace summary)."""
    import tarfile

    report = load_report()
    folder = tmp_path / suite
    folder.mkdir(parents=True)
    for way, summary in summaries.items():
        (folder / f"profile-{way}.summary.json").write_text(json.dumps({f"{way}/x.trace.json.gz": summary}))
    (folder / "device.txt").write_text("NVIDIA H200, 1, 2 MiB\n")
    with tarfile.open(tmp_path / f"{suite}.tar.gz", "w:gz") as tar:
        tar.add(folder, arcname=suite)
    runs = report.read_runs(tmp_path)
    assert all(report.profile_markdown(runs, other) == [] for other in report.PROFILE_MODELS if other != suite)
    return report.profile_markdown(runs, suite)


def test_the_report_shows_each_ways_summary(tmp_path):
    # gpu.sh's profile suite archives profile-<way>.summary.json; report.py turns them into one table.
    lines = profile_page(tmp_path, {"log": profile_step.analyse(decode_steps())})
    assert "| log | 1000.0 | 26.0 | 6.0 | 311.0 | 310.0 | 0 | aten::_local_scalar_dense 0/step (1 in all), " \
           "cudaLaunchKernel 2/step (8 in all), cudaStreamSynchronize 0/step (1 in all) |" in lines
    # A summary from before the graph was read: its cell says so.
    before = {k: v for k, v in profile_step.analyse(decode_steps()).items() if k != "graph_us"}
    assert any(line.startswith("| log | 1000.0 | 26.0 | 6.0 | 311.0 | - | 0 |")
               for line in profile_page(tmp_path / "old", {"log": before}))
    assert "| log | canary_pre_forward | 1 | 4.0 |" in lines  # each canary kernel's launches a step


def test_the_report_names_the_kernels_that_changed_between_the_ways(tmp_path):
    # A shape profiled both ways: the table lists the kernels whose time per step differs most, the engine's
    # too; a way profiled without Python stacks shows no host figure.
    ours = profile_step.analyse(decode_steps())
    off_events = [e for e in decode_steps() if not e["name"].startswith("canary_")]
    for e in off_events:
        if e["name"] == "flash_decode":
            e["dur"] = 290  # the engine's attention ran 10 us faster without the canary
    off = profile_step.analyse(off_events)
    lines = profile_page(tmp_path, {"none-8x1024": {**off, "stacks": False}, "log-8x1024": {**ours, "stacks": False}})
    assert "| 8x1024 | `flash_decode` | 290.0 | 300.0 | +10.0 |" in lines
    assert "| 8x1024 | `canary_pre_forward` | 0.0 | 4.0 | +4.0 |" in lines
    assert lines.index("| 8x1024 | `flash_decode` | 290.0 | 300.0 | +10.0 |") < \
        lines.index("| 8x1024 | `canary_pre_forward` | 0.0 | 4.0 | +4.0 |")  # the largest change first
    assert any(line.startswith("| log-8x1024 | 1000.0 | - (no stacks) |") for line in lines)


def test_each_profile_suite_has_its_own_section_naming_its_model_and_command(tmp_path):
    summary = {**profile_step.analyse(decode_steps()), "stacks": False}
    eight_b = profile_page(tmp_path / "8b", {"log": summary, "log-8x1024": summary})
    assert "## Where a decode step's time goes (sglang's profiler, `profile_step.py`)" in eight_b
    assert any(line.startswith("Machine: NVIDIA H200, 1, 2 MiB. Llama-3-8B (32 layers)") and
               line.endswith("Command: `bash bench/sglang_server/gpu.sh profile`.") for line in eight_b)
    one_b = profile_page(tmp_path / "1b", {"none-8x1024": summary, "log-8x1024": summary}, "profile-1b")
    assert "## Where a decode step's time goes (sglang's profiler, `profile_step.py`, Llama-3.2-1B)" in one_b
    assert any(line.startswith("Machine: NVIDIA H200, 1, 2 MiB. Llama-3.2-1B (16 layers)") and
               line.endswith("Command: `PROFILE_BATCHES=8 bash bench/sglang_server/gpu.sh profile-1b`.")
               for line in one_b)


def test_the_profile_command_gives_the_batches_only_when_they_are_not_the_default():
    report = load_report()
    assert report.profile_batches({"none": {}, "log": {}, "none-8x1024": {}, "log-8x1024": {}}) == ""
    assert report.profile_batches({"none-8x1024": {}, "log-8x1024": {}}) == "PROFILE_BATCHES=8 "
    assert report.profile_batches({"none": {}, "none-16x1024": {}}) == 'PROFILE_BATCHES="1 16" '
