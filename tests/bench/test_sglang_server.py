"""bench/sglang_server: the carry bundle is reproducible and checked, and the report is rebuilt from the archives."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parents[2] / "bench" / "sglang_server"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_sglang_server_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bundle = load("bundle")
report = load("report")


def fake_kernel_wheel(path: Path) -> None:
    members = {
        "sgl_kernel/__init__.py": b"import os\n",
        "sgl_kernel/flash_ops.abi3.so": b"\0" * 4096,
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": b"\1" * 512,
        "sgl_kernel/sm100/common_ops.abi3.so": b"\2" * 1024,
        "sgl_kernel/sm90/common_ops.abi3.so": b"\3" * 1024,
        "sgl_kernel/flash_attn.py": b"try:\n    from . import flash_ops\nexcept ImportError:\n    pass\n",
    }
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in members.items())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 7, 17, 22, 17, 0)), data)
        zf.writestr("sglang_kernel-0.4.5.dist-info/RECORD", record + "sglang_kernel-0.4.5.dist-info/RECORD,,\n")


def test_trim_drops_the_unused_kernels_and_their_record_lines(tmp_path):
    source, target = tmp_path / "k.whl", tmp_path / "trimmed.whl"
    fake_kernel_wheel(source)
    bundle.trim(source, target)
    with zipfile.ZipFile(target) as zf, zipfile.ZipFile(source) as src:
        names = zf.namelist()
        assert names == ["sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/flash_attn.py",
                         "sglang_kernel-0.4.5.dist-info/RECORD"]
        for name in names[:-1]:
            assert zf.read(name) == src.read(name)
        record = zf.read(names[-1]).decode()
    assert "flash_ops" not in record and "sm100" not in record and "infllm" not in record
    assert "sgl_kernel/sm90/common_ops.abi3.so" in record


def test_trim_is_byte_for_byte_reproducible(tmp_path):
    source = tmp_path / "k.whl"
    fake_kernel_wheel(source)
    bundle.trim(source, tmp_path / "a.whl")
    bundle.trim(source, tmp_path / "b.whl")
    assert (tmp_path / "a.whl").read_bytes() == (tmp_path / "b.whl").read_bytes()


def test_fetch_refuses_a_wheel_whose_hash_differs(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not the pinned bytes")
    with pytest.raises(SystemExit, match="does not match wheels.lock"):
        bundle.fetch(wheel.name, "0" * 64, tmp_path)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert bundle.fetch(wheel.name, digest, tmp_path) == wheel


def test_split_keeps_every_part_under_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "PART_LIMIT", 100)
    paths = []
    for i, size in enumerate([60, 50, 40, 30, 20, 10, 90]):
        path = tmp_path / f"w{i}.whl"
        path.write_bytes(b"x" * size)
        paths.append(path)
    parts = bundle.split(paths)
    assert sorted(p for part in parts for p in part) == sorted(paths)
    assert all(sum(p.stat().st_size for p in part) <= 100 for part in parts)
    assert len(parts) == 3  # 300 bytes in parts of 100
    (tmp_path / "big.whl").write_bytes(b"x" * 101)
    with pytest.raises(SystemExit, match="larger than one part"):
        bundle.split([tmp_path / "big.whl"])


def test_the_lock_pins_every_wheel_by_sha256_and_the_trim_of_a_pinned_one():
    pins, trimmed = bundle.read_lock()
    assert len(pins) > 50 and len(trimmed) == 1
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in [*pins.values(), *trimmed.values()])
    assert all(name.endswith(".whl") for name in pins)
    assert set(trimmed) <= set(pins)
    assert any(name.startswith("sglang-0.5.17-") for name in pins)


def test_report_rebuilds_the_committed_page_from_the_committed_archives(tmp_path):
    results = HERE / "results"
    folder = tmp_path / "results"
    shutil.copytree(results, folder)
    (folder / "RESULTS.md").unlink()
    (folder / "results.json").unlink()
    report.main([str(folder)])
    assert (folder / "RESULTS.md").read_text() == (results / "RESULTS.md").read_text()
    assert (folder / "results.json").read_text() == (results / "results.json").read_text()


def cost_log(throughputs: list[float], tokens: list[int], batch: int = 8, context: int = 1024) -> str:
    lines = [f"[t] Decode batch, #running-req: {batch}, #token: {n}, token usage: 0.1, cuda graph: True, "
             f"gen throughput (token/s): {x}, #queue-req: 0" for x, n in zip(throughputs, tokens)]
    return f"cost: begin batch {batch} context {context}\n" + "\n".join(lines) + f"\ncost: end batch {batch} context {context}\n"


def run(log: str, step_ms: float = 1.0) -> dict:
    return {"log": log, "json": {"shapes": [{"batch": 8, "context": 1024, "step_ms": step_ms}]}}


def test_cost_pairs_the_decode_lines_of_the_same_steps():
    off = run(cost_log([1000.0, 1000.0, 500.0], [100, 200, 300]))
    ours = run(cost_log([990.0, 995.0, 400.0], [100, 200, 300]))
    (row,) = report.cost_table({"off": off, "ours": ours})
    # 8 tokens / 1000 per s = 8 ms; ours 8.0808, 8.0402, 20 ms: paired changes +1.01 %, +0.50 %, +25 %;
    # off's steady state is the median of its lower two lines (8 ms), ours that times +1.01 %.
    assert row["ours"]["vs_off_pct"] == pytest.approx(1.0101, abs=1e-3)
    assert row["off"]["step_ms"] == pytest.approx(8.0)
    assert row["ours"]["step_ms"] == pytest.approx(8.0 * 1.010101, abs=1e-3)


def test_the_cost_bar_is_judged_on_the_faster_engine_of_each_way():
    tokens = [100, 200, 300]
    off = run(cost_log([1000.0] * 3, tokens))
    slow_off = run(cost_log([800.0] * 3, tokens))  # a second canary-off engine in a slower mode: +25 %
    ours = run(cost_log([800.0] * 3, tokens))  # ours landed in that mode too
    ours_again = run(cost_log([998.0] * 3, tokens))  # the same canary on a normal engine: +0.2 %
    (alone,) = report.cost_table({"off": off, "ours": ours})
    assert alone["verdict_pct"] == pytest.approx(25.0)
    (row,) = report.cost_table({"off": off, "ours": ours, "off-again": slow_off, "ours-again": ours_again})
    assert row["verdict_pct"] == pytest.approx(0.2, abs=1e-3)
    # Both offs slow but one: ours is judged against the fast one, not the slow one.
    (row,) = report.cost_table({"off": slow_off, "ours": ours, "off-again": off, "ours-again": ours})
    assert row["verdict_pct"] == pytest.approx(25.0, abs=1e-3)


def test_the_instrumented_copy_with_the_canary_off_is_a_column_of_its_own_not_the_verdict():
    tokens = [100, 200, 300]
    off = run(cost_log([1000.0] * 3, tokens))
    ours = run(cost_log([995.0] * 3, tokens))  # +0.5 %
    ours_none = run(cost_log([1005.0] * 3, tokens))  # the copy alone runs 0.5 % faster than the release
    (row,) = report.cost_table({"off": off, "ours": ours, "ours-none": ours_none})
    assert row["ours-none"]["vs_off_pct"] == pytest.approx(-0.4975, abs=1e-3)
    assert row["verdict_pct"] == pytest.approx(0.5025, abs=1e-3)  # judged on ours against canary off, as before
    page = report.cost_markdown("llama3-8b", {}, [row], "an H200")
    assert "| batch x context | canary off | ours | ours' copy, canary off | ours against the bar |" in page
    assert any("*ours' copy, canary off* is the instrumented copy" in line for line in page)


def test_each_pair_of_one_call_is_compared_alone_so_a_first_engine_that_changed_speed_moves_none_of_it():
    tokens = [100, 200, 300, 400]
    off = run(cost_log([500.0, 500.0, 1000.0, 1000.0], tokens))  # slow for half its life, then normal
    ours = run(cost_log([990.0] * 4, tokens))
    off_again = run(cost_log([1000.0] * 4, tokens))
    ours_again = run(cost_log([995.0] * 4, tokens))
    ours_none = run(cost_log([1000.0] * 4, tokens))
    (row,) = report.cost_table({"off": off, "ours": ours, "off-again": off_again, "ours-again": ours_again,
                                "ours-none": ours_none})
    assert row["pairs"]["ours-again/off-again"] == pytest.approx(0.5025, abs=1e-3)
    assert row["pairs"]["ours-again/ours-none"] == pytest.approx(0.5025, abs=1e-3)
    # ours against the first off: -49.5 % on its slow lines, +1.01 % on the others; the median, between them
    assert row["pairs"]["ours/off"] == pytest.approx((-49.495 + 1.0101) / 2, abs=1e-2)
    page = report.cost_markdown("llama3-8b", {}, [row], "an H200")
    assert ("| batch x context | ours against canary off | ours, again against canary off, again | ours, again "
            "against ours' copy, canary off |") in page
    assert "| 8 x 1024 | -24.24 % | +0.50 % | +0.50 % |" in page
    # With one engine a way there is one pair, and the table has its one column.
    (alone,) = report.cost_table({"off": off_again, "ours": ours_again})
    assert alone["pairs"] == {"ours/off": pytest.approx(0.5025, abs=1e-3)}


def test_engines_in_turns_have_a_section_of_their_own_that_says_how_they_ran():
    tokens = [100, 200, 300]
    meta = {"turn": "0/4", "reps": 8, "short": 16, "long": 208, "pool_tokens": 400000}
    off = {**run(cost_log([1000.0] * 3, tokens)), "json": {**run("")["json"], **meta}}
    ours = run(cost_log([998.0] * 3, tokens))  # +0.2 %
    (row,) = report.cost_table({"off": off, "ours": ours})
    suites = {"cost-1b-turns": {"off": off, "ours": ours, report.DEVICE: "NVIDIA H200, 580"}}
    page = report.cost_markdown("llama3.2-1b-turns", suites, [row], "an H100")
    assert page[1] == "## Cost per decode step (Llama-3.2-1B, 16 layers, bf16, engines in turns)"
    assert "Machine: NVIDIA H200, 580. Command: `bash bench/sglang_server/gpu.sh cost-1b-turns`." in page
    text = "\n".join(page)
    assert "worked in turns" in text and "8 reps" in text and "capped at 400,000 tokens" in text
    assert "| 8 x 1024 | 8.000 ms (1000/s) | 8.016 ms (998/s) [+0.20 %, +16 us] | within (+0.20 %) |" in page
    assert "median of 8), ms per step:" in text
    assert "Each pair of one machine alone" not in text  # every change here is already of one call


def test_in_one_call_a_cell_whose_control_moved_past_the_bar_is_not_resolved():
    tokens = [100, 200, 300]
    off = run(cost_log([1000.0] * 3, tokens))
    ours = run(cost_log([990.0] * 3, tokens))  # +1.01 %
    steady = run(cost_log([999.0] * 3, tokens))  # the copy with the canary off: +0.1 %, inside the bar
    slowed = run(cost_log([970.0] * 3, tokens))  # the same copy in a slow stretch: +3.1 %
    suites = {"cost-1b-turns": {"off": off, "ours": ours}}
    (row,) = report.cost_table({"off": off, "ours": ours, "ours-none": steady})
    page = report.cost_markdown("llama3.2-1b-turns", suites, [row], "an H200")
    assert any(line.endswith("| **over** (+1.01 %) |") for line in page) and "*not resolved*" in "\n".join(page)
    (row,) = report.cost_table({"off": off, "ours": ours, "ours-none": slowed})
    page = report.cost_markdown("llama3.2-1b-turns", suites, [row], "an H200")
    assert any(line.endswith("| not resolved (+1.01 %; ours' copy, canary off +3.09 %) |") for line in page)
    # One after another the copy ran in another call, on another day: it judges no cell there.
    page = report.cost_markdown("llama3.2-1b", {}, [row], "an H200")
    assert any(line.endswith("| **over** (+1.01 %) |") for line in page) and "*not resolved*" not in "\n".join(page)


def test_cost_refuses_lines_that_cover_other_steps():
    off = run(cost_log([1000.0, 1000.0], [100, 200]))
    ours = run(cost_log([1000.0, 1000.0], [100, 201]))
    with pytest.raises(SystemExit, match="do not cover the same steps"):
        report.cost_table({"off": off, "ours": ours})


def test_a_bug_run_says_how_its_engine_ended():
    leak = ("Scheduler hit an exception: Traceback (most recent call last):\n"
            "ValueError: pool memory leak detected! [full] total=4096, available=45")
    json = {"ok": False, "error": "killed before it finished"}
    exited = {"json": json, "log": leak, "watch": {"exit": -9, "elapsed_s": 118.2, "killed_at_limit": False}}
    hung = {"json": json, "log": leak, "watch": {"exit": -9, "elapsed_s": 480.0, "killed_at_limit": True,
                                                 "limit_s": 480.0}}
    outlived = {"json": json, "log": leak, "watch": None}  # the call's time ran out before its watcher wrote
    assert report.bug_cell(exited, ours=False).endswith("; exited -9 after 118 s")
    assert "**hung**, killed at 480 s" in report.bug_cell(hung, ours=False)
    assert report.bug_cell(outlived, ours=False) == (
        "sglang raised `ValueError: pool memory leak detected! [full] total=4096, available=45`; **still running** "
        "when its call's time ran out (killed with it)")
    assert report.bug_cell({"json": {"ok": True}, "log": "", "watch": None}, ours=False) == (
        "served to the end, nothing reported")


def test_the_perturbation_table_counts_a_flip_evicted_unread_apart_from_the_misses():
    flips = [f"kv_canary_perturb= step={s} kind=real_kv_unused_cache group=full half=k slot={s} position=3 req=-1 "
             "applied=1 layer=0 byte=1 bit=2" for s in (10, 20, 30, 40)]
    read = ("kv_canary violation: kernel=sweep group=full half=k reason=fingerprint slot=10 position=3 stored=1 "
            "expected=2 req=-1 step=12")
    left = "kv_canary_perturb_left_cache= step=25 kind=real_kv_unused_cache injected=20 position=3 how=evicted"
    log = "\n".join(["kv_canary perturb: enabled real_kv_unused_cache=0.02 (seed 0, from step 1)", *flips, read, left])
    kind_row, all_row = report.score_rows(report.perturb_score(log), "")
    # 1 reported of the 3 readable (the 20's slot left the cache unread; the 30 and 40 are plain misses).
    assert kind_row == "| real_kv_unused_cache | 4 | 1 (33 %) | 2 | 1 | 2/2/2 |"
    assert all_row.startswith("| **all** | 4 | 1 | 2 | 1 | violations 1, unattributed 0")
    # A log from before the line: every unread flip a miss, the share over all of them.
    assert report.score_rows(report.perturb_score(log.replace(left, "")), "")[0] == (
        "| real_kv_unused_cache | 4 | 1 (25 %) | 3 | 0 | 2/2/2 |")


def test_a_run_that_stopped_its_perturbations_for_the_sweep_tail_says_so():
    log = "\n".join([
        "kv_canary perturb: enabled real_kv_unused_cache=0.02 (seed 0, from step 1)",
        "kv_canary_perturb= step=10 kind=real_kv_unused_cache group=full half=k slot=10 position=3 req=-1 applied=1 "
        "layer=0 byte=1 bit=2",
        "kv_canary_perturb_stopped= step=12 file=/tmp/mha-perturb.perturb-stop",
        "kv_canary violation: kernel=sweep group=full half=k reason=fingerprint slot=10 position=3 stored=1 expected=2 "
        "req=-1 step=48",
    ])
    tail = {"steps": 304, "pool": 16384, "slots": 4096, "interval": 16, "tokens": 304}
    row = report.correctness_row("mha-perturb", {"json": {"perturb": 0.02, "sweep_tail": tail}, "log": log})
    assert (row["perturb_stopped_at"], row["injected_after_stop"], row["sweep_tail"]) == (12, 0, tail)
    assert row["score"]["kinds"]["real_kv_unused_cache"]["reported"] == 1
    [note] = report.tail_notes([row])[1:]
    assert note.startswith("- `mha-perturb`: perturbations stopped at step 12 (after the drain); 0 injections after "
                           "it; then a sweep tail of 304 steps")
    # A run from before the stop: its row and the page say nothing of it.
    old = report.correctness_row("mha-perturb", {"json": {"perturb": 0.02}, "log": log.splitlines()[0]})
    assert "perturb_stopped_at" not in old and "sweep_tail" not in old and report.tail_notes([old]) == []


def test_the_drain_stops_the_perturbations_then_serves_a_tail_the_sweep_reads_the_whole_cache_in(tmp_path, monkeypatch):
    serve = load("serve")
    # A pass takes at most pool // slots + (pool + 1) // slots + 1 slices (rows or node visits fill a slice); the
    # tail covers the first slice's wait, the rest of the pass under way and a whole pass.
    assert serve.sweep_tail_steps(16384, 4096, 16) == 16 * (2 * 9 + 1) == 304
    assert serve.sweep_tail_steps(100, 4096, 16) == 16 * 3
    stop = tmp_path / "stop"
    monkeypatch.setenv("SGLANG_KV_CANARY_PERTURB_STOP_FILE", str(stop))
    calls = []

    class Engine:
        def get_server_info(self):
            return {"max_total_num_tokens": 16384}

        def generate(self, input_ids, sampling_params):
            calls.append((input_ids, sampling_params, stop.exists()))
            return [{"output_ids": [7] * sampling_params["max_new_tokens"]} for _ in input_ids]

    args = SimpleNamespace(perturb=0.02, kv_canary_sweep_interval=16, kv_canary="log", pool_tokens=16384)
    out = serve.drain(Engine(), args, [[5, 6], [8]], speculative=True)
    (drain_ids, _, stopped_before), (tail_ids, tail_params, stopped_for_tail) = calls
    assert drain_ids == [[5, 6, 1], [8, 1]] and not stopped_before and stopped_for_tail
    assert tail_ids == [[0]] and tail_params["max_new_tokens"] == 304 * 4  # an EAGLE verify makes up to 4 tokens
    assert out["sweep_tail"] == {"steps": 304, "pool": 16384, "slots": 4096, "interval": 16, "tokens": 1216}
    calls.clear()
    assert serve.drain(Engine(), SimpleNamespace(**{**vars(args), "kv_canary_sweep_interval": 0}), [[5]], False) == {}
    assert len(calls) == 1  # no sweep: the drain alone


def lock_release(lock: Path) -> str:
    """The sglang release a lock pins."""
    return next(line.split()[1].split("-")[1] for line in lock.read_text().splitlines()
                if line and not line.startswith("#") and line.split()[1].startswith("sglang-"))


@pytest.mark.parametrize("release", ["0.5.17", "0.5.14"])
def test_the_release_gpu_sh_serves_is_instrumented_with_a_green_gate(tmp_path, release):
    """gpu.sh's step before any GPU work (instrument.py): scaffold and apply on a copy of the release's
    package (the one its lock pins: wheels.lock by default, SGLANG_RELEASE=0.5.14 its own), then `apply
    --check` and `check` exit 0 with no finding. Run here on the CPU, so CI sees a break of it before a GPU
    machine does."""
    from tests.realtree.conftest import sglang_srt

    package = sglang_srt(lock_release(bundle.lock_file(release))).parent
    dest = tmp_path / "ours" / "sglang"
    proc = subprocess.run([sys.executable, str(HERE / "instrument.py"), str(package), str(dest)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("-> exit 0") == 4
    # The paths sglang's own wiring leaves bare are bracketed: the prefill graph's capture and warm-up.
    prefill = (dest / "srt/model_executor/runner/prefill_cuda_graph_runner.py").read_text()
    assert "canary_ctx = self.canary_ctx(active=0)" in prefill
    assert "canary_warmup_ctx = self.canary_ctx(active=0)" in prefill
    assert not (tmp_path / "ours" / "sglang.tmp").exists()


def test_a_red_gate_leaves_no_package_behind(tmp_path):
    package = tmp_path / "sglang"
    (package / "srt/model_executor").mkdir(parents=True)
    (package / "srt/model_executor/model_runner.py").write_text("def broken(:\n")
    dest = tmp_path / "ours" / "sglang"
    proc = subprocess.run([sys.executable, str(HERE / "instrument.py"), str(package), str(dest)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "the gate is not green" in proc.stderr
    assert not dest.exists()


def test_every_bug_of_the_corpus_applies_to_the_release_gpu_sh_serves(tmp_path):
    """Each bug is one exact edit of the release's source (bugs.py refuses a text found other than once):
    a release whose code moved would otherwise waste a GPU run."""
    from tests.realtree.conftest import sglang_srt

    bugs = load("bugs")
    package = sglang_srt(lock_release(bundle.lock_file("0.5.17"))).parent
    for name, bug in bugs.BUGS.items():
        source = (package / "srt" / bug.path).read_text()
        assert source.count(bug.old) == 1, f"{name}: {bug.path}"
        dest = tmp_path / name / "sglang"
        (dest / "srt" / bug.path).parent.mkdir(parents=True)
        (dest / "srt" / bug.path).write_text(source)
        bugs.apply(dest, name)
        assert (dest / "srt" / bug.path).read_text() != source


def test_the_written_tokenizer_encodes_any_decoded_ids_back_to_the_same_ids(tmp_path):
    # bench_serving's random-ids prompts are token ids decoded to text; the server must count as many tokens.
    tokenizers = pytest.importorskip("tokenizers")
    models = load("models")
    models.write_tokenizer(tmp_path, 128256)
    tokenizer = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = [0, 5, 77, 128000, 128001, 128255, 42, 42]
    assert tokenizer.encode(tokenizer.decode(ids)).ids == ids
    assert tokenizer.get_vocab_size() == 128256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


# The second release, sglang 0.5.14 (gpu.sh with SGLANG_RELEASE=0.5.14, bundle.py --release 0.5.14).


def test_the_0_5_14_lock_pins_every_wheel_by_sha256_and_the_trim_of_its_kernel():
    lock = bundle.lock_file("0.5.14")
    assert lock == HERE / "wheels-0.5.14.lock" and bundle.lock_file("0.5.17") == HERE / "wheels.lock"
    assert bundle.bundle_dir("0.5.14") == Path(".whl/sglang-server-0.5.14")
    assert bundle.bundle_dir(bundle.DEFAULT_RELEASE) == Path(".whl/sglang-server")
    pins, trimmed = bundle.read_lock(lock)
    assert len(pins) > 50 and len(trimmed) == 1
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in [*pins.values(), *trimmed.values()])
    assert all(name.endswith(".whl") for name in pins)
    assert set(trimmed) <= set(pins)
    assert lock_release(lock) == "0.5.14"
    # 0.5.14's exact pins (its METADATA's Requires-Dist) among the wheels carried; none of 0.5.17's left behind.
    versions = {name.split("-")[0]: name.split("-")[1] for name in pins}
    assert {k: versions.get(k) for k in ("sglang_kernel", "flashinfer_python", "transformers", "apache_tvm_ffi",
                                         "sgl_deep_gemm", "openai", "openai_harmony", "xgrammar", "soundfile",
                                         "blobfile")} == {
        "sglang_kernel": "0.4.4", "flashinfer_python": "0.6.12", "transformers": "5.8.1", "apache_tvm_ffi": "0.1.9",
        "sgl_deep_gemm": "0.1.3", "openai": "2.6.1", "openai_harmony": "0.0.4", "xgrammar": "0.2.1",
        "soundfile": "0.13.1", "blobfile": "3.0.0"}
    assert versions["llguidance"].startswith("0.7.") and next(iter(trimmed)).startswith("sglang_kernel-0.4.4-")


def test_report_keeps_another_release_s_archive_apart(tmp_path):
    # gpu.sh with SGLANG_RELEASE=0.5.14 wrote 0.5.14-gate.tar.gz (holding the folder 0.5.14-gate) beside 0.5.17's.
    import json

    folder = tmp_path / "results"
    shutil.copytree(HERE / "results", folder)
    report.main([str(folder)])
    rows = json.loads((folder / "results.json").read_text())["correctness"]
    ours = [r for r in rows if r["suite"] == "0.5.14-gate"]
    assert ours and all(r["run"].startswith("0.5.14-") for r in ours)
    assert {r["run"].removeprefix("0.5.14-") for r in ours} <= {r["run"] for r in rows if r["suite"] == "gate"}
    page = (folder / "RESULTS.md").read_text()
    assert "Release: sglang 0.5.17 " in page and "Suites and runs named `0.5.14-...` ran sglang 0.5.14 instead." in page
    assert "| inf | ours, sglang 0.5.14 |" in page  # its HTTP server, a row of its own


def test_a_machine_of_several_like_gpus_is_named_once_with_their_count():
    line = "NVIDIA H200, 580.159.04, 143771 MiB"
    assert report.machine(f"{line}\n{line}\n") == f"2 x {line}"
    assert report.machine(f"{line}\n") == line


def test_the_tensor_parallel_table_counts_each_rank_s_violations_and_shows_the_combined_line():
    log = "\n".join([
        "[2026-11-29 13:05:48 TP0] kv_canary violation: kernel=post_forward group=full half=k reason=token slot=1",
        "[2026-11-29 13:05:48 TP1] kv_canary violation: kernel=post_forward group=full half=k reason=token slot=1",
        "[2026-11-29 13:05:49 TP1] kv_canary violation: kernel=pre_forward group=full half=v reason=link slot=2",
        "[2026-11-29 13:05:50 TP0] kv_canary ranks: step=16 ranks=2 violations=2 written=40 unhealthy_ranks=[]",
        "[2026-11-29 13:05:51 TP0] kv_canary ranks: step=32 ranks=2 violations=3 written=44 unhealthy_ranks=[]",
    ])
    suites = {"tp2": {report.DEVICE: "2 x GPU", "tp2-mha-perturb": {"json": None, "log": log, "watch": None}}}
    page = "\n".join(report.ranks_markdown(suites))
    assert "| tp2-mha-perturb | 1 / 2 | 32 | 2 | 3 | 44 | [] |" in page
    assert report.ranks_markdown({}) == []


def test_each_table_names_the_gpu_sh_calls_that_made_it_one_per_release_and_machine():
    h200, two = {report.DEVICE: "NVIDIA H200, 580"}, {report.DEVICE: "2 x NVIDIA H200, 580"}
    suites = {"gate": h200, "mtp": h200, "tp2": two, "0.5.14-gate": h200, "correctness": {}, "flood": h200}
    assert report.commands(suites, {"gate", "mtp", "tp2", "correctness"}, "NVIDIA H100 80GB HBM3, 580") == (
        "Commands: `bash bench/sglang_server/gpu.sh tp2` (2 x NVIDIA H200); `bash bench/sglang_server/gpu.sh "
        "correctness` (NVIDIA H100 80GB HBM3); `bash bench/sglang_server/gpu.sh gate mtp` (NVIDIA H200); "
        "`SGLANG_RELEASE=0.5.14 bash bench/sglang_server/gpu.sh gate` (NVIDIA H200).")
    assert report.commands(suites, ("gate", "mtp")) == (
        "Commands: `bash bench/sglang_server/gpu.sh gate mtp`; `SGLANG_RELEASE=0.5.14 bash bench/sglang_server/gpu.sh "
        "gate`.")  # one machine: not named
    assert report.commands(suites, ("cost-a",)) == ""


@pytest.mark.parametrize("suite, ways", [
    ("cost-1b-turns", {"off": ("site", "none"), "ours": ("ours", "log"), "upstream": ("site", "log"),
                       "ours-none": ("ours", "none")}),
    ("cost-turns", {"off": ("site", "none"), "ours": ("ours", "log")}),
])
def test_gpu_sh_starts_every_engine_of_a_suite_in_turns_with_its_own_turn_and_one_counter(tmp_path, suite, ways):
    """gpu.sh's suites in turns, with stand-ins for python3 and nvidia-smi that record what each engine was given:
    every way once, its sglang (the release or the applied copy) and canary, turn i of n, all on one counter file
    that starts at 0."""
    work, out, bin_ = tmp_path / "work", tmp_path / "out", tmp_path / "bin"
    for part in ("part1", "part2", "part3", "part4"):  # the bundle installed, the copy instrumented
        (work / "done" / part).parent.mkdir(parents=True, exist_ok=True)
        (work / "done" / part).touch()
    (work / "ours" / "sglang").mkdir(parents=True)
    bin_.mkdir()
    (bin_ / "python3").write_text('#!/bin/sh\necho "$PYTHONPATH|$*" >> "$CALLS"\n')
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200, 580, 143771 MiB'\n")
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "SGLANG_SERVER_WORK": str(work), "OUT": str(out),
           "CALLS": str(tmp_path / "calls")}
    proc = subprocess.run(["bash", str(HERE / "gpu.sh"), suite], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == len(ways)
    seen = {}
    for call in calls:
        path, argv = call.split("|")
        args = argv.split()
        name = Path(args[args.index("--out") + 1]).stem
        seen[name] = args
        sglang, canary = ways[name]
        assert path.split(":")[0] == str(work / sglang)
        assert args[args.index("--kv-canary") + 1] == canary
        assert args[args.index("--turns") + 1] == str(work / f"{suite}.turns")
        assert args[args.index("--reps") + 1] == "8"
    # One turn each, in the suite's order of ways: canary off works first.
    assert [seen[way][seen[way].index("--turn") + 1] for way in ways] == [f"{i}/{len(ways)}" for i in range(len(ways))]
    assert (work / f"{suite}.turns").read_text().strip() == "0"
    assert (out / f"{suite}.tar.gz").exists()
