"""Copy the pristine reference engine, instrument it with the CLI, and import the result.

The engine ships inside the wheel as `canary_instrument._engine`; from a source checkout it
is `golden/engine`. The CLI runs as `python -m canary_instrument ...` subprocesses, exactly
as a user would run it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINE_PACKAGE = "refsgl"
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # .../canary_instrument


def pristine_engine_dir() -> Path:
    """Folder holding the pristine `refsgl` package (installed wheel first, then the source tree)."""
    try:
        spec = importlib.util.find_spec("canary_instrument._engine")
    except ModuleNotFoundError:
        spec = None
    # A folder without __init__.py: a namespace package, so look at its search locations.
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / ENGINE_PACKAGE).is_dir():
            return Path(location)
    source = _PACKAGE_ROOT.parent / "golden" / "engine"
    if (source / ENGINE_PACKAGE).is_dir():
        return source
    raise FileNotFoundError(
        "the reference engine is missing: neither canary_instrument._engine (installed) "
        f"nor {source} (source checkout) holds a {ENGINE_PACKAGE}/ package"
    )


def copy_engine(dest: Path) -> Path:
    """Copy the pristine engine's Python sources to `dest` (which must not exist)."""
    shutil.copytree(
        pristine_engine_dir() / ENGINE_PACKAGE,
        Path(dest) / ENGINE_PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return Path(dest)


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(Path(root).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


@dataclass(frozen=True)
class FileDiff:
    path: str
    added: int
    removed: int


def diff_stat(before: dict[str, str], after: dict[str, str]) -> list[FileDiff]:
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, ""), after.get(path, "")
        if old == new:
            continue
        added = removed = 0
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        out.append(FileDiff(path, added, removed))
    return out


@dataclass(frozen=True)
class ToolRun:
    command: str
    returncode: int
    output: str


def run_tool(command: str, root: Path) -> ToolRun:
    """`python -m canary_instrument <command> <root>` in a subprocess that finds this very package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "canary_instrument", command, str(root)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(root),
    )
    return ToolRun(command, proc.returncode, (proc.stdout + proc.stderr).strip())


class ToolFailed(RuntimeError):
    pass


def instrument(root: Path) -> dict[str, object]:
    """scaffold, check, apply, check on `root`; returns each run and the diff stats between states."""
    pristine = snapshot(root)
    runs = {}
    for command in ("scaffold", "check"):
        runs[command] = run_tool(command, root)
        if runs[command].returncode != 0:
            raise ToolFailed(f"canary-instrument {command} exited {runs[command].returncode}:\n{runs[command].output}")
    scaffolded = snapshot(root)
    runs["apply"] = run_tool("apply", root)
    if runs["apply"].returncode != 0:
        raise ToolFailed(f"canary-instrument apply exited {runs['apply'].returncode}:\n{runs['apply'].output}")
    runs["check_wired"] = run_tool("check", root)
    if runs["check_wired"].returncode != 0:
        raise ToolFailed(f"canary-instrument check after apply exited {runs['check_wired'].returncode}:\n"
                         f"{runs['check_wired'].output}")
    wired = snapshot(root)
    return {
        "runs": runs,
        "scaffold_diff": diff_stat(pristine, scaffolded),
        "apply_diff": diff_stat(scaffolded, wired),
    }


def import_engine(root: Path):
    """Import `refsgl` from `root`, replacing any copy imported earlier in this process."""
    for name in [n for n in sys.modules if n == ENGINE_PACKAGE or n.startswith(ENGINE_PACKAGE + ".")]:
        del sys.modules[name]
    root_str = str(Path(root).resolve())
    if root_str in sys.path:
        sys.path.remove(root_str)
    sys.path.insert(0, root_str)
    importlib.invalidate_caches()
    return importlib.import_module(f"{ENGINE_PACKAGE}.srt.entrypoints.engine")
