"""Benchmark `canary-instrument check` (the pre-commit gate) against ast-grep, libcst and grep.

Copies the running interpreter's standard library to a temp folder, times each tool on it
(best and median of N), times the pre-commit hook on a small clean repo and `apply` on the
reference engine, and writes a Markdown report. Run from the repo root:

    .venv/bin/python bench/check/bench_check.py --repeat 10 --out bench/check/RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "golden" / "engine"
PATTERN = "contextlib.nullcontext()"


def env_with_repo() -> dict[str, str]:
    env = dict(os.environ)
    # An installed tool runs from compiled bytecode; let the source checkout get its .pyc too.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def tool_command() -> list[str]:
    """The console script when installed next to this interpreter, else `python -m`."""
    script = Path(sys.executable).parent / "canary-instrument"
    return [str(script)] if script.exists() else [sys.executable, "-m", "canary_instrument"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(argv, cwd=None, env=None, ok=(0, 1)) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (user + system, the child and its waited-for descendants) of one run."""
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    cpu = children_cpu() - cpu
    if proc.returncode not in ok:
        raise RuntimeError(
            f"{' '.join(map(str, argv))} exited {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return elapsed, cpu, proc


def stats(samples: list[tuple[float, float]]) -> dict:
    walls = [w for w, _ in samples]
    return {
        "best": min(walls),
        "median": statistics.median(walls),
        "cpu": statistics.median(c for _, c in samples),
        "n": len(samples),
    }


def series(fn, repeat: int, warmup: int = 1) -> dict:
    """fn() -> (wall, cpu); warm-up runs are discarded."""
    for _ in range(warmup):
        fn()
    return stats([fn() for _ in range(repeat)])


def interleaved(fns: dict, repeat: int) -> dict:
    """Run the tools round-robin, so a burst of load elsewhere on the machine hits all of them alike."""
    for fn in fns.values():
        fn()
    samples: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name].append(fn())
    return {name: stats(values) for name, values in samples.items()}


def copy_stdlib(dest: Path) -> tuple[Path, dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    target = dest / "Lib"
    shutil.copytree(
        stdlib, target, symlinks=True,
        ignore=shutil.ignore_patterns("site-packages", "__pycache__"),
    )
    py = [p for p in target.rglob("*.py") if p.is_file()]
    counts = {
        "source": str(stdlib),
        "py_files": len(py),
        "py_bytes": sum(p.stat().st_size for p in py),
        "all_files": sum(1 for p in target.rglob("*") if p.is_file()),
    }
    sys.path.insert(0, str(REPO))
    from canary_instrument.rewrite.files import SourceError, iter_python_files

    walked = list(iter_python_files([target]))
    counts["walked_files"] = sum(not isinstance(p, SourceError) for p in walked)
    return target, counts


def stdlib_tools(tree: Path, skip: list[str]) -> tuple[dict, dict]:
    """The tools timed on the stdlib copy: name -> fn() returning (wall, cpu); plus their details."""
    fns, details = {}, {}
    if "check" not in skip:
        argv = [*tool_command(), "check", str(tree)]
        env = env_with_repo()
        sub_info = details["check_subprocess"] = {"command": " ".join(argv)}

        def check_subprocess():
            wall, cpu, proc = timed_run(argv, env=env, ok=(0, 1, 2))
            sub_info["rc"], sub_info["lines"] = proc.returncode, len(proc.stdout.splitlines())
            return wall, cpu

        fns["check_subprocess"] = check_subprocess
    if "inproc" not in skip:
        sys.path.insert(0, str(REPO))
        start = time.perf_counter()
        from canary_instrument import cli

        in_info = details["check_in_process"] = {"import_s": time.perf_counter() - start}

        def check_in_process():
            cpu = time.process_time()
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    code = cli.main.main(args=["check", str(tree)], standalone_mode=False)
                except SystemExit as exc:
                    code = exc.code
            wall = time.perf_counter() - start
            in_info.setdefault("first", wall)
            in_info["rc"] = code
            return wall, time.process_time() - cpu

        fns["check_in_process"] = check_in_process
    exe = shutil.which("ast-grep", path=str(Path(sys.executable).parent)) or shutil.which("ast-grep")
    if "ast-grep" not in skip and exe:
        ast_grep_argv = [exe, "run", "-p", PATTERN, str(tree)]
        details["ast_grep"] = {"command": f"ast-grep run -p '{PATTERN}' {tree}"}
        fns["ast_grep"] = lambda: timed_run(ast_grep_argv)[:2]
    if "grep" not in skip:
        grep_argv = ["grep", "-r", "-F", PATTERN, str(tree)]
        details["grep"] = {"command": f"grep -r -F '{PATTERN}' {tree}"}
        fns["grep"] = lambda: timed_run(grep_argv)[:2]
    return fns, details


def bench_libcst_parse(tree: Path) -> dict:
    """Parse every file once with libcst, as a rewriter that parsed everything would."""
    import libcst

    from canary_instrument.rewrite.files import SourceError, iter_python_files

    paths = [p for p in iter_python_files([tree]) if not isinstance(p, SourceError)]
    failures = 0
    cpu = time.process_time()
    start = time.perf_counter()
    for path in paths:
        try:
            libcst.parse_module(path.read_bytes())
        except Exception:  # noqa: BLE001 - counting what libcst refuses, whatever the reason
            failures += 1
    elapsed = time.perf_counter() - start
    return {"best": elapsed, "median": elapsed, "cpu": time.process_time() - cpu, "n": 1,
            "files": len(paths), "failures": failures,
            "libcst": importlib.metadata.version("libcst")}


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)


def hook_source(work: Path) -> tuple[Path, str]:
    """A committed copy of this working tree, as pre-commit clones hook repositories."""
    source = work / "hook-source"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():
            dst = source / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    git("init", "-q", cwd=source)
    git("add", "-A", cwd=source)
    git("-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-qm", "snapshot", cwd=source)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, check=True, capture_output=True,
                         text=True).stdout.strip()
    return source, sha


def scaffolded_engine(dest: Path) -> Path:
    shutil.copytree(ENGINE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    timed_run([*tool_command(), "scaffold", str(dest)], env=env_with_repo(), ok=(0,))
    return dest


def bench_pre_commit(work: Path, repeat: int, source_kind: str) -> dict:
    repo = scaffolded_engine(work / "precommit-repo")
    env = env_with_repo()
    env["PRE_COMMIT_HOME"] = str(work / "pre-commit-home")
    if source_kind == "clone":
        source, sha = hook_source(work)
        config = f"repos:\n- repo: {source}\n  rev: {sha}\n  hooks:\n  - id: canary-instrument-check\n"
    else:
        config = (
            "repos:\n- repo: local\n  hooks:\n  - id: canary-instrument-check\n"
            "    name: canary-instrument check\n"
            f"    entry: {' '.join(tool_command())} check\n    args: [.]\n"
            "    language: system\n    pass_filenames: false\n    always_run: true\n"
        )
    (repo / ".pre-commit-config.yaml").write_text(config)
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-qm", "clean", cwd=repo)
    pre_commit = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or "pre-commit"
    run_argv = [pre_commit, "run", "--all-files", "canary-instrument-check"]
    start = time.perf_counter()
    timed_run(run_argv, cwd=repo, env=env, ok=(0,))  # first run builds the hook environment
    install_s = time.perf_counter() - start
    result = {
        "pre_commit": series(lambda: timed_run(run_argv, cwd=repo, env=env, ok=(0,))[:2], repeat),
        "install_s": install_s,
        "files": sum(1 for _ in repo.rglob("*.py")),
        "source_kind": source_kind,
        "command": " ".join(["pre-commit", *run_argv[1:]]),
    }
    bare = [*tool_command(), "check", "."]
    result["bare"] = series(lambda: timed_run(bare, cwd=repo, env=env, ok=(0,))[:2], repeat)
    result["bare_command"] = " ".join(bare)
    # The very command pre-commit runs: the console script in the hook's own virtualenv.
    hook_scripts = sorted(Path(env["PRE_COMMIT_HOME"]).glob("repo*/py_env-*/bin/canary-instrument"))
    if hook_scripts:
        hook_argv = [str(hook_scripts[0]), "check", "."]
        hook_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        result["hook"] = series(lambda: timed_run(hook_argv, cwd=repo, env=hook_env, ok=(0,))[:2], repeat)
    noop = work / "noop-repo"
    noop.mkdir()
    (noop / "a.py").write_text("x = 1\n")
    (noop / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n  - id: noop\n    name: noop\n    entry: 'true'\n"
        "    language: system\n    pass_filenames: false\n    always_run: true\n"
    )
    git("init", "-q", cwd=noop)
    git("add", "-A", cwd=noop)
    git("-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-qm", "noop", cwd=noop)
    noop_argv = [pre_commit, "run", "--all-files", "noop"]
    result["pre_commit_floor"] = series(lambda: timed_run(noop_argv, cwd=noop, env=env, ok=(0,))[:2], repeat)
    return result


def bench_apply(work: Path, repeat: int) -> dict:
    scaffolded = scaffolded_engine(work / "engine-scaffolded")
    env = env_with_repo()
    counter = iter(range(10**6))

    def once():
        tree = work / f"apply-{next(counter)}"
        shutil.copytree(scaffolded, tree)
        return timed_run([*tool_command(), "apply", str(tree)], env=env, ok=(0,))[:2]

    result = {"apply": series(once, repeat)}
    applied = work / "apply-0"
    result["noop"] = series(
        lambda: timed_run([*tool_command(), "apply", str(applied)], env=env, ok=(0,))[:2], repeat
    )
    result["files"] = sum(1 for _ in scaffolded.rglob("*.py"))
    result["command"] = " ".join([*tool_command(), "apply", "<copy of scaffolded golden/engine>"])
    return result


def machine() -> dict:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "load": os.getloadavg(),
        "nproc": os.cpu_count() if not hasattr(os, "sched_getaffinity") else len(os.sched_getaffinity(0)),
        "cpu": model,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
    }


def fmt(r: dict) -> str:
    return f"{r['best']:.3f} | {r['median']:.3f} | {r['cpu']:.3f} | {r['n']}"


HEADER = [
    "| what | wall best (s) | wall median (s) | CPU median (s) | runs |",
    "|---|---|---|---|---|",
]


def report(results: dict, argv: list[str]) -> str:
    m, c = results["machine"], results["counts"]
    sub = results.get("check_subprocess")
    lines = [
        "# `check` benchmark",
        "",
        "Produced by:",
        "",
        "```",
        f"{' '.join(argv)}",
        "```",
        "",
        f"- machine: {m['nproc']} cores, {m['cpu']}, {m['platform']}",
        f"- Python {m['python']}, {m['date']}; load average (1/5/15 min) before: "
        f"{'/'.join(f'{x:.2f}' for x in m['load'])}, after: "
        f"{'/'.join(f'{x:.2f}' for x in results['load_after'])} (the machine is shared; medians "
        "are noisier than bests; CPU time, user + system, moves least with load)",
        f"- tree: a copy of `{c['source']}` without `site-packages` and `__pycache__`: "
        f"{c['py_files']} `.py` files, {c['py_bytes']:,} bytes of Python ({c['all_files']} files in all); "
        f"the tool's walk visits {c['walked_files']} of them (it skips `venv/`-named folders, "
        "so stdlib's `venv` package is not walked)",
        "",
        "The stdlib measurements (all but libcst) ran round-robin, one run of each per round, after one warm-up",
        "run each, so load elsewhere on the shared machine falls on all of them alike.",
        "",
        "| what | wall best (s) | wall median (s) | CPU median (s) | runs | wall best / check's |",
        "|---|---|---|---|---|---|",
    ]

    def row(name, r):
        if r is None or "skipped" in r:
            lines.append(f"| {name} | skipped | | | | |")
            return
        ratio = f"{r['best'] / sub['best']:.1f}x" if sub and "best" in sub else ""
        lines.append(f"| {name} | {fmt(r)} | {ratio} |")

    row("`canary-instrument check` (subprocess, interpreter start included)", sub)
    inproc = results.get("check_in_process")
    row("`check` in-process (warm: modules imported)", inproc)
    row("ast-grep", results.get("ast_grep"))
    row("full libcst parse of every file (once)", results.get("libcst"))
    row("grep", results.get("grep"))
    lines.append("")
    if sub and inproc:
        lines.append(
            f"- bar: check <= 0.5 s on 2 cores: subprocess wall best {sub['best']:.3f} s, median "
            f"{sub['median']:.3f} s ({'met' if sub['median'] <= 0.5 else 'MISSED'} at the median)"
        )
    if sub:
        lines.append(f"- check command: `{sub['command']}` (exit {sub['rc']}, {sub['lines']} output lines)")
    if inproc:
        lines.append(
            f"- in-process: importing the CLI took {inproc['import_s']:.3f} s, the first check "
            f"{inproc['first']:.3f} s (exit {inproc['rc']})"
        )
    lines.append(
        "- ast-grep runs on both cores, so other load on the machine stretches its wall time more "
        "than that of the single-threaded check; compare CPU medians as well as wall bests"
    )
    for key in ("ast_grep", "grep"):
        if results.get(key) and "command" in results[key]:
            lines.append(f"- {key.replace('_', '-')}: `{results[key]['command']}`")
    if results.get("libcst"):
        lc = results["libcst"]
        lines.append(f"- libcst {lc['libcst']}: parsed {lc['files']} files, {lc['failures']} refused")
    pc = results.get("pre_commit")
    if pc:
        lines += [
            "",
            f"## pre-commit on a clean small repo ({pc['files']} `.py` files: the scaffolded reference engine)",
            "",
            *HEADER,
            f"| `{pc['command']}` (hook source: {pc['source_kind']}) | {fmt(pc['pre_commit'])} |",
            f"| bare hook command `{pc['bare_command']}` | {fmt(pc['bare'])} |",
            *([f"| the hook's console script in pre-commit's virtualenv, `canary-instrument check .` "
               f"| {fmt(pc['hook'])} |"] if "hook" in pc else []),
            f"| pre-commit's own floor: a no-op `true` system hook | {fmt(pc['pre_commit_floor'])} |",
            "",
            f"- first `pre-commit run` (builds the hook environment): {pc['install_s']:.1f} s",
            "- bar: a pre-commit invocation <= 0.3 s including interpreter start: the hook command "
            f"(console script in the hook virtualenv) {pc.get('hook', pc['bare'])['median']:.3f} s median; "
            f"the whole `pre-commit run` {pc['pre_commit']['median']:.3f} s median, of which pre-commit's "
            f"own floor is {pc['pre_commit_floor']['median']:.3f} s",
            "- the gap between `pre-commit run` and its floor plus the hook is pre-commit's own work for a "
            "`language: python` hook: on every run its health check starts the hook virtualenv's "
            "interpreter to compare versions (`pre_commit/languages/python.py`, `health_check`)",
        ]
    ap = results.get("apply")
    if ap:
        lines += [
            "",
            f"## apply on the reference engine ({ap['files']} `.py` files)",
            "",
            *HEADER,
            f"| `{ap['command']}` | {fmt(ap['apply'])} |",
            f"| apply again on the wired tree (nothing to do) | {fmt(ap['noop'])} |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip", action="append", default=[],
                        choices=["check", "inproc", "ast-grep", "grep", "libcst", "pre-commit", "apply"])
    parser.add_argument("--hook-source", choices=["clone", "local"], default="clone",
                        help="clone: pre-commit builds the hook from a committed copy of this repo; "
                             "local: a `repo: local` system hook calling the tool directly")
    args = parser.parse_args()

    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        work = Path(tmp)
        tree, results["counts"] = copy_stdlib(work)
        print(results["counts"], flush=True)
        fns, details = stdlib_tools(tree, args.skip)
        for key, result in interleaved(fns, args.repeat).items():
            results[key] = {**result, **details[key]}
            print(key, results[key], flush=True)
        steps = [
            ("pre-commit", "pre_commit", lambda: bench_pre_commit(work, args.repeat, args.hook_source)),
            ("apply", "apply", lambda: bench_apply(work, args.repeat)),
            ("libcst", "libcst", lambda: bench_libcst_parse(tree)),
        ]
        for name, key, step in steps:
            if name in args.skip:
                continue
            results[key] = step()
            print(key, results[key], flush=True)
    results["load_after"] = os.getloadavg()
    text = report(results, [Path(sys.executable).name, *sys.argv])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
