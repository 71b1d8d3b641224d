"""Benchmark `canary-instrument check` as a pre-commit gate on the newest sglang release, beside ast-grep.

It copies the release's `srt` package into a temporary git repository (its files dated an hour back, as a
checkout nobody is editing this second) and times, round-robin after one untimed run of each, so that load
elsewhere on a shared machine falls on all of them alike:

- ast-grep over the tree (`ast-grep run -p 'contextlib.nullcontext()' -l python <tree>`);
- check cold (`--no-cache`) and warm (its cache filled, nothing changed), and warm after an edit of a file
  no rule needs (every report from the cache, the call graph and CI301's caller search redone);
- `ast.parse` of every file of the tree in one process: the least a check without its byte prefilter
  (which decides which files to parse) would pay;
- `pre-commit run --all-files` of a hook that does nothing and of the check hook (warm), in that repository.

Bars: cold check at most three quarters of ast-grep's time, measured in the same run; warm check at
most 0.5 s. It writes two tables (check beside ast-grep; pre-commit's own cost beside the hook's) to
`--out`. Run from the repository root, with ast-grep and pre-commit installed next to this interpreter or
on PATH:

    .venv/bin/python bench/check/bench_check.py --sglang 0.5.23 --rounds 11 --out bench/check/RESULTS.md

The release comes from `$CANARY_INSTRUMENT_SGLANG_CACHE/<version>/sglang/srt` (default
`~/.cache/canary-instrument/sglang`), else a wheel fetched with `pip download --no-deps sglang==<version>`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATTERN = "contextlib.nullcontext()"
COLD_BAR = 0.75  # of ast-grep's time
WARM_BAR = 0.5  # seconds
AST_GREP = "ast-grep"
COLD = "check cold (`--no-cache`)"
WARM = "check warm (nothing changed)"
EDITED = "check warm, a file no rule needs edited"
PARSE = "`ast.parse` of every file (no prefilter)"
PARSE_ALL = """import ast, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.py")):
    try:
        ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        pass
"""
NOOP = "`pre-commit run --all-files noop` (a hook that does nothing)"
HOOK = "`pre-commit run --all-files canary-instrument-check` (warm)"


def find_srt(version: str) -> Path:
    """The unpacked `sglang/srt` package of a release: the cache, else PyPI (into the cache)."""
    cache = Path(os.environ.get("CANARY_INSTRUMENT_SGLANG_CACHE", Path.home() / ".cache/canary-instrument/sglang"))
    if (cache / version / "sglang" / "srt").is_dir():
        return cache / version / "sglang" / "srt"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", tmp,
                        f"sglang=={version}"], check=True, capture_output=True, timeout=600)
        with zipfile.ZipFile(next(Path(tmp).glob("sglang-*.whl"))) as wheel:
            wheel.extractall(cache / version, [m for m in wheel.namelist() if m.startswith("sglang/srt/")])
    return cache / version / "sglang" / "srt"


def tool(name: str) -> str:
    """A tool installed next to this interpreter, else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found: install it next to {sys.executable} or on PATH")
    return found


def timed(argv, cwd=None, env=None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the command and its children) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def git(*args, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c",
                           "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def age(root: Path, seconds: float = 3600) -> None:
    past = time.time() - seconds
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past))


def hook_repository(work: Path) -> tuple[Path, str]:
    """A committed copy of this working tree: pre-commit clones it and builds the hook's own virtualenv,
    as a user's config does."""
    source = work / "hook-source"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    git("init", "-q", cwd=source)
    git("add", "-A", cwd=source)
    git("commit", "-qm", "snapshot", cwd=source)
    return source, git("rev-parse", "HEAD", cwd=source).strip()


def commands(srt: Path, work: Path) -> dict:
    """name -> a function that runs it once and returns (wall, cpu)."""
    repo = work / "repo"
    tree = repo / "srt"
    shutil.copytree(srt, tree, ignore=shutil.ignore_patterns("__pycache__"))
    source, sha = hook_repository(work)
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {source}\n  rev: {sha}\n  hooks:\n  - id: canary-instrument-check\n"
        "- repo: local\n  hooks:\n  - id: noop\n    name: noop\n    entry: 'true'\n    language: system\n"
        "    pass_filenames: false\n    always_run: true\n"
    )
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "tree", cwd=repo)
    age(repo)
    env = dict(os.environ, PRE_COMMIT_HOME=str(work / "pre-commit-home"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed tool runs from compiled bytecode
    check = [tool("canary-instrument"), "check"]
    pre_commit = tool("pre-commit")
    other = next(path for path in sorted(tree.rglob("*.py")) if not any(
        word in path.read_bytes() for word in (b"canary", b"_runner", b"_forward_raw", b"_capture_graph")))
    edits = [0]

    def edited():
        """Warm for the tree as it is, then the file edited: time that run, and put the file back."""
        cache = str(work / "cache-edited")
        timed([*check, "--cache-dir", cache, str(tree)], env=env)
        original, st = other.read_bytes(), other.stat()
        edits[0] += 1
        other.write_bytes(original + f"# edit {edits[0]}\n".encode())
        try:
            return timed([*check, "--cache-dir", cache, str(tree)], env=env)
        finally:
            other.write_bytes(original)
            os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))

    return {
        AST_GREP: lambda: timed([tool("ast-grep"), "run", "-p", PATTERN, "-l", "python", str(tree)]),
        COLD: lambda: timed([*check, "--no-cache", str(tree)], env=env),
        WARM: lambda: timed([*check, "--cache-dir", str(work / "cache-warm"), str(tree)], env=env),
        EDITED: edited,
        PARSE: lambda: timed([sys.executable, "-c", PARSE_ALL, str(tree)]),
        NOOP: lambda: timed([pre_commit, "run", "--all-files", "noop"], cwd=repo, env=env),
        HOOK: lambda: timed([pre_commit, "run", "--all-files", "canary-instrument-check"], cwd=repo, env=env),
    }


def interleaved(fns: dict, rounds: int) -> dict:
    """Round-robin, one run of each per round, after one untimed run each: name -> [(wall, cpu)]."""
    for fn in fns.values():
        fn()
    samples: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(fn())
    return samples


def report(samples: dict, srt: Path, version: str, rounds: int, argv: list[str]) -> str:
    files = sorted(srt.rglob("*.py"))
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    versions = {name: subprocess.run([tool(name), "--version"], capture_output=True, text=True).stdout.strip()
                for name in ("ast-grep", "pre-commit")}

    def wall(name):
        return statistics.median(w for w, _ in samples[name])

    def row(name, base=None):
        walls = [w for w, _ in samples[name]]
        cells = [f"{min(walls):.3f}", f"{statistics.median(walls):.3f}",
                 f"{statistics.median(c for _, c in samples[name]):.3f}"]
        if base is not None:
            per_round = statistics.median(w / b for (w, _), (b, _) in zip(samples[name], samples[base]))
            cells += [f"{wall(name) / wall(base):.2f}", f"{per_round:.2f}"]
        return f"| {name} | " + " | ".join(cells) + " |"

    cold = statistics.median(w / b for (w, _), (b, _) in zip(samples[COLD], samples[AST_GREP]))
    lines = [
        "# `check` benchmark: the pre-commit gate on the newest sglang release",
        "",
        f"sglang {version} `srt` ({len(files):,} `.py` files, {sum(p.stat().st_size for p in files):,} bytes), "
        f"a copy in a fresh git repository; {rounds} rounds, each command once per round (round-robin, after "
        "an untimed run of each); seconds. Machine: 2-core VM "
        f"({os.cpu_count()} cores, {model}), shared with other work (load average {load} at the end); "
        f"Python {platform.python_version()}; {versions['ast-grep']}, {versions['pre-commit']}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Produced by:",
        "",
        "```",
        " ".join(argv),
        "```",
        "",
        "## check beside ast-grep",
        "",
        "| command | wall min | wall median | CPU median | median / ast-grep's | per round / ast-grep's |",
        "|---|---|---|---|---|---|",
        *(row(name, AST_GREP) for name in (AST_GREP, COLD, WARM, EDITED, PARSE)),
        "",
        f"- bar, cold check at most {COLD_BAR} of ast-grep's time: {cold:.2f} (median of the rounds' ratios; "
        f"{'met' if cold <= COLD_BAR else 'MISSED'})",
        f"- bar, warm check at most {WARM_BAR} s: median {wall(WARM):.3f} s "
        f"({'met' if wall(WARM) <= WARM_BAR else 'MISSED'})",
        "- the edited row is a warm run without the cache's outcome of the whole tree (kept only for a tree in "
        "which nothing changed): every report from the cache, the call graph and CI301's caller search redone",
        "- the `ast.parse` row is what check would pay at least without its byte prefilter "
        "(`rewrite/io/prefilter.py`), which decides from each file's bytes which files to parse",
        "",
        "## pre-commit's own cost beside the check hook's",
        "",
        "| command | wall min | wall median | CPU median |",
        "|---|---|---|---|",
        row(NOOP),
        row(HOOK),
        "",
        f"- the check hook adds {wall(HOOK) - wall(NOOP):.3f} s (medians) to what pre-commit itself takes",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", default="0.5.23", metavar="VERSION", help="the release to time on")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out", type=Path, help="write the Markdown tables here")
    args = parser.parse_args()
    srt = find_srt(args.sglang)
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        samples = interleaved(commands(srt, Path(tmp)), args.rounds)
    text = report(samples, srt, args.sglang, args.rounds, [Path(sys.executable).name, *sys.argv])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
