"""check's content-hash cache (like ruff's): what each file contributed last time, reused while it is unchanged.

One cache file per invocation (tool build, effective catalog, given paths) under
`.canary-instrument-cache/` at the git root holding the first path (a tree outside git gets no
new folder: its cache goes to the user's cache folder, as platformdirs names it: on Linux
`$XDG_CACHE_HOME/canary-instrument`). An entry is reused when the file's size, mtime and inode are
what they were (and the mtime is not so recent that a same-tick edit could hide behind it), or else
when its content hash is. The file is signed with a key kept in the user's own cache folder, so a
cache that was tampered with, copied from elsewhere, truncated or written by another build is
ignored, never trusted. Writes are atomic and happen only when something changed.

The hashing, signing and folder modules are imported where they are used: a run without a cache
(`check --no-cache`, the cold gate) never loads them.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import canary_instrument
from canary_instrument.catalog import Catalog

FOLDER = ".canary-instrument-cache"
ENV_DIR = "CANARY_INSTRUMENT_CACHE_DIR"
_FORMAT = 1
_RACY_NS = 2_000_000_000  # an mtime this close to the last save may hide a same-tick edit: rehash it
_DIGEST = 32  # bytes of the HMAC-SHA256 signature in front of the pickle


def content_hash(data: bytes) -> bytes:
    import hashlib

    return hashlib.blake2b(data, digest_size=16).digest()


def user_cache_dir() -> Path:
    """This user's cache folder for the tool (platformdirs: `$XDG_CACHE_HOME/canary-instrument` on Linux)."""
    from platformdirs import user_cache_path

    return user_cache_path("canary-instrument", appauthor=False)


def default_cache_dirs(paths) -> list[Path]:
    """`.canary-instrument-cache` at the git root holding the first path (if any), then the user's cache."""
    first = Path(os.path.abspath(paths[0] if paths else "."))
    start = first if first.is_dir() else first.parent
    found = []
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            found.append(folder / FOLDER)
            break
    return [*found, user_cache_dir()]


def tool_digest() -> str:
    """The tool's build: its version, and the size and mtime of the modules check runs (a source
    checkout changes them without a new version)."""
    package = Path(canary_instrument.__file__).parent
    parts = [canary_instrument.__version__, sys.version]
    folders = ["rewrite", "catalog"]
    for folder in folders:  # grows with the subpackages found: every layer of the rewriter counts
        try:
            with os.scandir(package / folder) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    if entry.name.endswith((".py", ".toml")):
                        st = entry.stat()
                        parts.append(f"{folder}/{entry.name}:{st.st_size}:{st.st_mtime_ns}")
                    elif entry.name != "__pycache__" and entry.is_dir():
                        folders.append(f"{folder}/{entry.name}")
        except OSError:
            parts.append(f"{folder}:?")
    import hashlib

    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()


class CheckCache:
    """Per-file entries of one check invocation: `path -> (size, mtime_ns, ino, hash, needs, payload)`
    (plain tuples, not black's NamedTuple: unpickling one per file costs the warm run more).

    `payload` is whatever check stores for the file (its FileReport, a SourceError, or None for a
    file that needed no analysis), pickled; `extra` holds tree-level data check keeps between runs.
    """

    def __init__(self, file: Path | None, key: bytes | None) -> None:
        self.file = file
        self._key = key
        self.entries: dict[str, tuple] = {}
        self.extra: dict = {}
        self.saved_ns = 0
        self.changed = False

    @classmethod
    def open(cls, paths, catalog: Catalog, cache_dir: str | Path | None = None) -> CheckCache:
        """The cache for checking `paths` with `catalog`; one that cannot be used does nothing."""
        import hashlib

        key = _signing_key()
        if key is None:
            return cls(None, None)
        given = cache_dir or os.environ.get(ENV_DIR)
        candidates = [Path(given)] if given else default_cache_dirs(paths)
        name = hashlib.blake2b(
            "\n".join([
                tool_digest(), repr(catalog), os.getcwd(), *(os.path.abspath(p) for p in paths),
            ]).encode(),
            digest_size=16,
        ).hexdigest()
        for folder in candidates:
            if _prepare(folder):
                cache = cls(folder / f"check-{name}.bin", key)
                cache._load()
                return cache
        return cls(None, None)

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def lookup(self, path: str, st: os.stat_result | None):
        """The entry when the file's stat shows it unchanged since a save that came after its mtime."""
        entry = self.entries.get(path)
        if entry is None or st is None:
            return None
        if (entry[0], entry[1], entry[2]) == (st.st_size, st.st_mtime_ns, st.st_ino) and \
                st.st_mtime_ns < self.saved_ns - _RACY_NS:
            return entry
        return None

    def lookup_hash(self, path: str, digest: bytes):
        entry = self.entries.get(path)
        return entry if entry is not None and entry[3] == digest else None

    def store(self, path: str, st: os.stat_result, digest: bytes, needs: int, payload) -> None:
        """Keep a file's outcome; the payload is kept pickled, so that loading the cache costs little
        and a run that does not need a file's report never unpickles it (`payload`)."""
        if payload is not None and not isinstance(payload, bytes):
            payload = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        entry = (st.st_size, st.st_mtime_ns, st.st_ino, digest, needs, payload)
        old = self.entries.get(path)
        if old is None or old[:5] != entry[:5]:
            self.changed = True
        self.entries[path] = entry

    @staticmethod
    def payload(stored):
        """A stored payload as an object (what `store` was given)."""
        return pickle.loads(stored) if isinstance(stored, bytes) else stored

    def retain(self, paths) -> None:
        """Forget files that are gone."""
        gone = self.entries.keys() - paths
        if gone:
            self.changed = True
            for path in gone:
                del self.entries[path]

    def set_extra(self, name: str, value) -> None:
        if self.extra.get(name) != value:
            self.extra[name] = value
            self.changed = True

    def save(self) -> None:
        """Write the cache atomically if anything changed; a cache that cannot be written is skipped."""
        if self.file is None or not (self.changed or self._racy()):
            return
        import hashlib
        import hmac
        import tempfile

        now = time.time_ns()
        body = pickle.dumps((_FORMAT, now, self.entries, self.extra), protocol=pickle.HIGHEST_PROTOCOL)
        data = hmac.new(self._key, body, hashlib.sha256).digest() + body
        try:
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=".check-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(tmp, self.file)
                tmp = None
            finally:
                if tmp is not None:
                    os.unlink(tmp)
        except OSError:
            return
        self.saved_ns = now
        self.changed = False
        _forget_old(self.file.parent, now)

    def _racy(self) -> bool:
        """Entries saved while their mtime was recent: saving again (later) lets the next run trust their stat."""
        return any(entry[1] >= self.saved_ns - _RACY_NS for entry in self.entries.values())

    def _load(self) -> None:
        import hashlib
        import hmac

        try:
            with open(self.file, "rb") as handle:
                data = handle.read()
        except OSError:
            return
        signature, body = data[:_DIGEST], data[_DIGEST:]
        if not hmac.compare_digest(signature, hmac.new(self._key, body, hashlib.sha256).digest()):
            return  # not written by this user's tool, or damaged: start afresh
        try:
            version, saved_ns, entries, extra = pickle.loads(body)
        except Exception:  # noqa: BLE001 - an unreadable cache is an empty cache
            return
        if version != _FORMAT or not isinstance(entries, dict) or not isinstance(extra, dict):
            return
        self.entries, self.extra, self.saved_ns = entries, extra, saved_ns


_STALE_NS = 30 * 24 * 3600 * 10**9


def _forget_old(folder: Path, now: int) -> None:
    """Remove cache files of invocations not run for 30 days (one file per invocation accumulates)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("check-") and entry.name.endswith(".bin"):
                    if now - entry.stat().st_mtime_ns > _STALE_NS:
                        os.unlink(entry.path)
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


def _signing_key() -> bytes | None:
    """This user's cache signing key (created on first use, readable by the user only)."""
    import secrets
    import tempfile

    path = user_cache_dir() / "cache-key"
    try:
        key = path.read_bytes()
        if len(key) == 32:
            return key
    except OSError:
        pass
    key = secrets.token_bytes(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path.read_bytes() if len(path.read_bytes()) == 32 else None
    except OSError:
        return None
