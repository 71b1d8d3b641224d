"""check's cache, on black's footing: one pickle per invocation, holding per file its size, mtime and
content hash and what check made of it, reused while the file is unchanged.

An invocation is the tool's build, the effective catalog and the given paths (as black keys its cache by
its mode). The file lives in `.canary-instrument-cache/` at the git root holding the first path, else in
the user's cache folder as platformdirs names it (on Linux `$XDG_CACHE_HOME/canary-instrument`). A file is
unchanged when its size and mtime are what they were (and the mtime is not so recent that a same-tick
edit could hide behind it), or else when its content hash is. A cache that cannot be read is an empty
one; writes are atomic and happen only when something changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import canary_instrument
from canary_instrument.catalog import Catalog

FOLDER = ".canary-instrument-cache"
ENV_DIR = "CANARY_INSTRUMENT_CACHE_DIR"
_FORMAT = 2
_RACY_NS = 2_000_000_000  # an mtime this close to the last save may hide a same-tick edit: rehash it
_STALE_NS = 30 * 24 * 3600 * 10**9  # cache files of invocations not run for this long are removed


def content_hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def user_cache_dir() -> Path:
    """This user's cache folder for the tool (platformdirs: `$XDG_CACHE_HOME/canary-instrument` on Linux)."""
    from platformdirs import user_cache_path

    return user_cache_path("canary-instrument", appauthor=False)


def default_cache_dirs(paths) -> list[Path]:
    """`.canary-instrument-cache` at the git root holding the first path (if any), then the user's cache."""
    first = Path(os.path.abspath(paths[0] if paths else "."))
    start = first if first.is_dir() else first.parent
    found = [folder / FOLDER for folder in (start, *start.parents) if (folder / ".git").exists()][:1]
    return [*found, user_cache_dir()]


def tool_digest() -> str:
    """The tool's build: its version, and the size and mtime of the modules check runs (a source
    checkout changes them without a new version)."""
    package = Path(canary_instrument.__file__).parent
    parts = [canary_instrument.__version__, sys.version]
    for folder in ("rewrite", "catalog"):
        for path in sorted((package / folder).rglob("*")):
            if path.suffix in (".py", ".toml"):
                st = path.stat()
                parts.append(f"{path.relative_to(package)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


@dataclass
class Entry:
    """One file as check last saw it: `needs` (what the rules need of it, `scan.needs_of`) and the
    reports check made of it, by the needs each was made for."""

    size: int
    mtime_ns: int
    digest: bytes
    needs: int
    reports: dict = field(default_factory=dict)


class CheckCache:
    """The entries of one check invocation, by path; `result` is the outcome of the run that saved them,
    with the hash of every file's path and content it was made from (`check_tree`)."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.entries: dict[str, Entry] = {}
        self.result: tuple | None = None
        self.saved_ns = 0
        self.changed = False

    @classmethod
    def open(cls, paths, catalog: Catalog, cache_dir: str | Path | None = None) -> CheckCache:
        """The cache for checking `paths` with `catalog`; one that cannot be used does nothing."""
        given = cache_dir or os.environ.get(ENV_DIR)
        name = hashlib.blake2b(
            "\n".join([tool_digest(), repr(catalog), os.getcwd(), *(os.path.abspath(p) for p in paths)]).encode(),
            digest_size=16,
        ).hexdigest()
        for folder in [Path(given)] if given else default_cache_dirs(paths):
            if _prepare(folder):
                cache = cls(folder / f"check-{name}.pickle")
                cache._read()
                return cache
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def get(self, path: str, st: os.stat_result | None, digest: bytes | None = None) -> Entry | None:
        """The entry of a file unchanged since it was saved: by its stat (given a save after its mtime),
        or, given the hash of its content, by that."""
        entry = self.entries.get(path)
        if entry is None or st is None:
            return None
        if digest is not None:
            return entry if entry.digest == digest else None
        same_stat = (entry.size, entry.mtime_ns) == (st.st_size, st.st_mtime_ns)
        return entry if same_stat and st.st_mtime_ns < self.saved_ns - _RACY_NS else None

    def put(self, path: str, st: os.stat_result, digest: bytes, needs: int, reports: dict) -> None:
        old = self.entries.get(path)
        entry = Entry(st.st_size, st.st_mtime_ns, digest, needs, reports)
        if old is None or (old.size, old.mtime_ns, old.digest, old.needs, old.reports.keys()) != (
                entry.size, entry.mtime_ns, entry.digest, entry.needs, entry.reports.keys()):
            self.changed = True
        self.entries[path] = entry

    def retain(self, paths) -> None:
        """Forget files that are gone."""
        for path in self.entries.keys() - paths:
            del self.entries[path]
            self.changed = True

    def set_result(self, result: tuple) -> None:
        if self.result != result:
            self.result = result
            self.changed = True

    def write(self) -> None:
        """Write the cache atomically if anything changed (or if an entry's mtime was too recent to be
        trusted: saving later lets the next run trust it); a cache that cannot be written is skipped."""
        if self.file is None or not (self.changed or any(e.mtime_ns >= self.saved_ns - _RACY_NS
                                                         for e in self.entries.values())):
            return
        now = time.time_ns()
        try:
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".check-", suffix=".tmp")
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as handle:
                pickle.dump((_FORMAT, now, self.entries, self.result), handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.file)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        self.saved_ns, self.changed = now, False
        _forget_old(self.file.parent, now)

    def _read(self) -> None:
        try:
            with open(self.file, "rb") as handle:
                version, saved_ns, entries, result = pickle.load(handle)
        except Exception:  # noqa: BLE001 - no cache yet, or one this build cannot read: start afresh
            return
        if version == _FORMAT and isinstance(entries, dict):
            self.entries, self.result, self.saved_ns = entries, result, saved_ns


def _forget_old(folder: Path, now: int) -> None:
    """Remove cache files of invocations not run for 30 days (one file per invocation accumulates)."""
    for path in folder.glob("check-*.pickle"):
        try:
            if now - path.stat().st_mtime_ns > _STALE_NS:
                path.unlink()
        except OSError:
            pass


def _prepare(folder: Path) -> bool:
    """Create the cache folder with a `.gitignore` (`*`) and a CACHEDIR.TAG, as ruff does."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# Automatically created by canary-instrument.\n*\n")
        tag = folder / "CACHEDIR.TAG"
        if not tag.exists():
            tag.write_text(
                "Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by canary-instrument.\n"
            )
        return os.access(folder, os.W_OK)
    except OSError:
        return False
