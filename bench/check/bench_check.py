"""Benchmark `canary-instrument check` as a pre-commit gate, beside ast-grep and grep, on real sglang trees.

For each tree (released sglang `srt` packages, and a copy of this interpreter's standard library) it
copies the tree into a temporary git repository and times, round-robin so that load elsewhere on a
shared machine falls on all of them alike:

- ast-grep (`ast-grep run -p 'contextlib.nullcontext()' -l python <tree>`) and grep (`grep -rl canary`);
- check cold: `--no-cache`, and with the cache cleared (what a first run pays, cache write included);
- check warm: cache populated, nothing changed; a file no rule needs edited; the largest site file edited;
- the hook's command alone in the repository (`canary-instrument check .`, warm);
- the whole `pre-commit run --all-files canary-instrument-check` in that repository (warm).

It records each tree's findings by code and writes a Markdown report. Run from the repo root:

    .venv/bin/python bench/check/bench_check.py --sglang 0.5.14 --sglang 0.5.17 --sglang 0.5.20 \\
        --sglang 0.5.23 --stdlib --repeat 7 --out bench/check/RESULTS.md

sglang trees come from `$CANARY_INSTRUMENT_SGLANG_CACHE/<version>/sglang` (default
`~/.cache/canary-instrument/sglang`), else `/work/sglang_cache/<version>/sglang`, else a wheel fetched
with `pip download --no-deps sglang==<version>` into that cache (skipped, and said so, when offline).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATTERN = "contextlib.nullcontext()"
FINDING = re.compile(r"^.+?:\d+:\d+: (CI\d+) ", re.MULTILINE)
SITE_FILE = "model_executor/model_runner.py"  # the largest file every sglang check analyses


def sglang_cache() -> Path:
    return Path(os.environ.get("CANARY_INSTRUMENT_SGLANG_CACHE", Path.home() / ".cache/canary-instrument/sglang"))


def find_sglang(version: str) -> Path | None:
    """The unpacked `sglang` package of a release: the cache, the development machine's copy, or PyPI."""
    for base in (sglang_cache(), Path("/work/sglang_cache")):
        if (base / version / "sglang" / "srt").is_dir():
            return base / version / "sglang"
    target = sglang_cache() / version
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", tmp,
             f"sglang=={version}"], capture_output=True, text=True, timeout=600,
        )
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if proc.returncode != 0 or not wheels:
            print(f"sglang {version}: not in the cache and pip could not fetch it; skipped", file=sys.stderr)
            return None
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.startswith("sglang/") and m.endswith(".py")]
            wheel.extractall(target, members)
    return target / "sglang"


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
    return {"best": min(walls), "median": statistics.median(walls),
            "cpu": statistics.median(c for _, c in samples), "n": len(samples)}


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c",
                    "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True, text=True)


def age(root: Path, seconds: float = 3600) -> None:
    """Date the copy an hour back, as a checkout nobody is editing this second is (a file written in
    the last two seconds is re-hashed on every run, see rewrite/io/cache.py)."""
    past = time.time() - seconds
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past))


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
    git("commit", "-qm", "snapshot", cwd=source)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, check=True, capture_output=True,
                         text=True).stdout.strip()
    return source, sha


class TreeBench:
    """One tree copied into a git repository, and the commands timed on it."""

    def __init__(self, name: str, source: Path, work: Path, hook: tuple[Path, str] | None, pre_commit_home: Path):
        self.name = name
        self.repo = work / f"repo-{name}"
        shutil.copytree(source, self.repo / source.name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "site-packages"))
        self.tree = self.repo / source.name
        self.env = env_with_repo()
        self.env["PRE_COMMIT_HOME"] = str(pre_commit_home)
        self.cache_dir = work / f"cache-{name}"
        self.py_files = sum(1 for _ in self.tree.rglob("*.py"))
        self.py_bytes = sum(p.stat().st_size for p in self.tree.rglob("*.py"))
        self.site_file = self.tree / SITE_FILE if (self.tree / SITE_FILE).is_file() else None
        self.other_file = next(
            path for path in sorted(self.tree.rglob("*.py"))
            if not any(w in path.read_bytes() for w in (b"canary", b"_runner", b"_forward_raw", b"_capture_graph"))
        )  # a file no rule needs
        self.hook = hook
        self.edits = 0
        if hook is not None:
            source_repo, sha = hook
            config = f"repos:\n- repo: {source_repo}\n  rev: {sha}\n  hooks:\n  - id: canary-instrument-check\n"
        else:
            config = (
                "repos:\n- repo: local\n  hooks:\n  - id: canary-instrument-check\n    name: canary-instrument check\n"
                f"    entry: {' '.join(tool_command())} check\n    args: [.]\n    language: system\n"
                "    pass_filenames: false\n    always_run: true\n"
            )
        # A hook that does nothing: what `pre-commit run` itself costs on this tree, beside the 0.6 s bar.
        config += ("- repo: local\n  hooks:\n  - id: noop\n    name: noop\n    entry: 'true'\n"
                   "    language: system\n    pass_filenames: false\n    always_run: true\n")
        (self.repo / ".pre-commit-config.yaml").write_text(config)
        git("init", "-q", cwd=self.repo)
        git("add", "-A", cwd=self.repo)
        git("commit", "-qm", "tree", cwd=self.repo)
        age(self.repo)

    def check(self, *extra, cwd=None, target=None):
        argv = [*tool_command(), "check", *extra, str(target or self.tree)]
        return timed_run(argv, cwd=cwd, env=self.env, ok=(0, 1, 2))

    def commands(self, ast_grep: str | None) -> dict:
        """name -> fn() returning (wall, cpu)."""
        fns = {}
        if ast_grep:
            fns["ast-grep"] = lambda: timed_run([ast_grep, "run", "-p", PATTERN, "-l", "python", str(self.tree)])[:2]
        fns["grep"] = lambda: timed_run(["grep", "-rl", "canary", str(self.tree)])[:2]
        fns["check cold (--no-cache)"] = lambda: self.check("--no-cache")[:2]

        def cleared():
            shutil.rmtree(self.cache_dir / "cleared", ignore_errors=True)
            return self.check("--cache-dir", str(self.cache_dir / "cleared"))[:2]

        fns["check cold (cache cleared)"] = cleared
        fns["check warm (nothing changed)"] = lambda: self.check("--cache-dir", str(self.cache_dir / "warm"))[:2]

        def edited(path: Path):
            """Warm for the tree as it is, then one file edited: time that run, and put the file back
            (bytes and mtime), so that every other command sees the tree unchanged."""
            cache = str(self.cache_dir / f"edit-{path.name}")

            def run():
                self.check("--cache-dir", cache)
                original, st = path.read_bytes(), path.stat()
                self.edits += 1
                path.write_bytes(original + f"# edit {self.edits}\n".encode())
                try:
                    return self.check("--cache-dir", cache)[:2]
                finally:
                    path.write_bytes(original)
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            return run

        fns["check warm, a file no rule needs edited"] = edited(self.other_file)
        if self.site_file is not None:
            fns[f"check warm, {SITE_FILE} edited"] = edited(self.site_file)
        fns["hook command alone (`canary-instrument check .`, warm)"] = \
            lambda: self.check(cwd=self.repo, target=".")[:2]
        pre_commit = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or shutil.which("pre-commit")
        if pre_commit:
            argv = [pre_commit, "run", "--all-files", "canary-instrument-check"]
            fns["`pre-commit run --all-files canary-instrument-check` (warm)"] = \
                lambda: timed_run(argv, cwd=self.repo, env=self.env, ok=(0, 1))[:2]
            fns[NOOP] = lambda: timed_run([pre_commit, "run", "--all-files", "noop"], cwd=self.repo, env=self.env)[:2]
        return fns

    def findings(self) -> dict:
        _, _, proc = self.check("--no-cache")
        counts = collections.Counter(FINDING.findall(proc.stdout))
        return {"exit": proc.returncode, "by_code": dict(sorted(counts.items())),
                "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "clean",
                "ci301": [line for line in proc.stdout.splitlines() if ": CI301 " in line]}


def interleaved(fns: dict, repeat: int) -> dict:
    """Round-robin, one run of each per round, after one warm-up run each."""
    for fn in fns.values():
        fn()
    samples: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name].append(fn())
    return {name: stats(values) for name, values in samples.items()}


def machine() -> dict:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "load": os.getloadavg(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
    }


def tool_versions(ast_grep: str | None) -> dict:
    out = {}
    if ast_grep:
        out["ast-grep"] = subprocess.run([ast_grep, "--version"], capture_output=True, text=True).stdout.strip()
    pre_commit = shutil.which("pre-commit")
    if pre_commit:
        out["pre-commit"] = subprocess.run([pre_commit, "--version"], capture_output=True, text=True).stdout.strip()
    return out


def report(results: dict, argv: list[str]) -> str:
    m = results["machine"]
    lines = [
        "# `check` benchmark: the pre-commit gate on real sglang trees",
        "",
        "Produced by:",
        "",
        "```",
        " ".join(argv),
        "```",
        "",
        f"- machine: {m['nproc']} cores, {m['cpu']}, {m['platform']}; Python {m['python']}; {m['date']}",
        f"- load average (1/5/15 min) before: {'/'.join(f'{x:.2f}' for x in m['load'])}, after: "
        f"{'/'.join(f'{x:.2f}' for x in results['load_after'])}. The machine is shared with other test runs: "
        "every command ran round-robin (one run of each per round, after a warm-up run each), so load falls on "
        "all alike; medians move with it more than bests, CPU time (user + system) least.",
        f"- tools: {', '.join(f'{k} {v}' for k, v in results['tools'].items()) or 'none found'}"
        + ("" if results["ast_grep"] else "; **ast-grep not found: its rows and the cold bar are missing**"),
        f"- pre-commit hook source: {results['hook_source']} (`clone`: pre-commit builds the hook's own "
        "virtualenv from a commit of this repository, as a user's config does)",
        "- each tree is a copy in a fresh git repository, its files dated an hour back (a checkout nobody "
        "is editing this second; see rewrite/io/cache.py for why that matters)",
        "",
    ]
    for name, tree in results["trees"].items():
        rows = tree["timings"]
        base = rows.get("ast-grep")
        lines += [
            f"## {name}: {tree['py_files']:,} `.py` files, {tree['py_bytes']:,} bytes",
            "",
            "| what | wall best (s) | wall median (s) | CPU median (s) | runs | median / ast-grep's |",
            "|---|---|---|---|---|---|",
        ]
        for what, r in rows.items():
            ratio = f"{r['median'] / base['median']:.2f}" if base else ""
            lines.append(f"| {what} | {r['best']:.3f} | {r['median']:.3f} | {r['cpu']:.3f} | {r['n']} | {ratio} |")
        f = tree["findings"]
        codes = ", ".join(f"{code} x{n}" for code, n in f["by_code"].items()) or "none"
        lines += ["", f"- check findings (cold, exit {f['exit']}): {codes}; {f['summary']}"]
        for line in f["ci301"]:
            lines.append(f"  - `{line.split(': CI301')[0].replace(tree['root'] + '/', '')}` CI301")
        lines += bars(rows) + [""]
    return "\n".join(lines) + "\n"


NOOP = "`pre-commit run --all-files noop` (a hook that does nothing)"


def bars(rows: dict) -> list[str]:
    out = []
    base = rows.get("ast-grep")
    cold = rows.get("check cold (--no-cache)")
    if base and cold:
        out.append(f"- bar, cold check <= 1/4 of ast-grep: median {cold['median']:.3f} s vs ast-grep "
                   f"{base['median']:.3f} s = {cold['median'] / base['median']:.2f} "
                   f"({'met' if cold['median'] <= base['median'] / 4 else 'MISSED'}); best-to-best "
                   f"{cold['best'] / base['best']:.2f}")
    warm = rows.get("check warm (nothing changed)")
    if warm:
        out.append(f"- bar, warm check <= 0.5 s: median {warm['median']:.3f} s "
                   f"({'met' if warm['median'] <= 0.5 else 'MISSED'})")
    pc = next((r for k, r in rows.items() if k.startswith("`pre-commit run") and k != NOOP), None)
    if pc:
        noop = rows.get(NOOP)
        out.append(f"- bar, whole `pre-commit run` <= 0.6 s warm: median {pc['median']:.3f} s "
                   f"({'met' if pc['median'] <= 0.6 else 'MISSED'})"
                   + (f"; pre-commit with a hook that does nothing: {noop['median']:.3f} s" if noop else ""))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", action="append", default=[], metavar="VERSION",
                        help="an sglang release whose `srt` package to time on (repeatable)")
    parser.add_argument("--stdlib", action="store_true", help="also time on a copy of the standard library")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--hook-source", choices=["clone", "local"], default="clone")
    args = parser.parse_args()

    ast_grep = shutil.which("ast-grep", path=str(Path(sys.executable).parent)) or shutil.which("ast-grep")
    results: dict = {"machine": machine(), "tools": tool_versions(ast_grep), "ast_grep": bool(ast_grep),
                     "hook_source": args.hook_source, "trees": {}}
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        work = Path(tmp)
        hook = hook_source(work) if args.hook_source == "clone" else None
        trees = []
        for version in args.sglang:
            package = find_sglang(version)
            if package is not None:
                trees.append((f"sglang {version} srt", package / "srt"))
        if args.stdlib:
            trees.append((f"CPython {platform.python_version()} standard library", Path(sysconfig.get_paths()["stdlib"])))
        for index, (name, source) in enumerate(trees):
            bench = TreeBench(f"t{index}", source, work, hook, work / "pre-commit-home")
            print(f"{name}: {bench.py_files} files", flush=True)
            entry = {"py_files": bench.py_files, "py_bytes": bench.py_bytes, "root": str(bench.tree),
                     "findings": bench.findings(), "timings": interleaved(bench.commands(ast_grep), args.repeat)}
            results["trees"][name] = entry
            print(json.dumps(entry, indent=1), flush=True)
            shutil.rmtree(bench.repo, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    text = report(results, [Path(sys.executable).name, *sys.argv])
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
