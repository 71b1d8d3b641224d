"""Safe file IO for the rewriter: discover Python files, read them exactly, write them atomically.

Standard library only: this module sits on the pre-commit path, where every import costs start-up time.
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

# Finding codes for input the tool cannot process (reported with exit 2).
UNREADABLE = "CI901"  # missing, a directory where a file was expected, permission denied
BINARY = "CI902"  # NUL bytes: not Python source
UNDECODABLE = "CI903"  # bytes invalid in the declared (or default UTF-8) encoding, bad coding cookie
SYMLINK_LOOP = "CI904"  # a symbolic link that resolves back into itself or an ancestor
WRITE_FAILED = "CI905"  # the atomic write could not complete; the original is untouched

# Kept by hand, as black keeps DEFAULT_EXCLUDES; .gitignore files are not read with pathspec, whose import
# (55-62 ms with typing_extensions) would be a quarter of a warm check on every tree that holds one.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "__pycache__",
        "build",
        "dist",
        "node_modules",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".canary-instrument-cache",
    }
)

_NEWLINE = re.compile(rb"\r\n|\r|\n")
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=]")  # PEP 263


class SourceError(Exception):
    """A file the tool cannot process, located as `path:line:col` (line and column are 1-based)."""

    def __init__(self, path, line: int, col: int, code: str, message: str) -> None:
        self.path = path
        self.line = line
        self.col = col
        self.code = code
        self.message = message
        super().__init__(f"{path}:{line}:{col}: {code} {message}")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.col, self.code, self.message))


@dataclass(frozen=True)
class SourceFile:
    """A Python file as read from disk: `data` is the exact bytes, `text` their decoding.

    `text` keeps every newline as it is on disk (CRLF stays CRLF) and has no BOM; `encode` turns
    an edited text back into bytes in the file's own encoding, BOM included.
    """

    path: Path
    data: bytes
    text: str
    encoding: str = "utf-8"  # a codec name as tokenize reports it; "utf-8-sig" means a BOM

    def encode(self, text: str) -> bytes:
        return text.encode(self.encoding)


def _position(data: bytes, offset: int, encoding: str) -> tuple[int, int]:
    """1-based line and column (in characters) of byte `offset`, counting newlines as Python does."""
    line_start = 0
    line = 1
    for match in _NEWLINE.finditer(data, 0, offset):
        line += 1
        line_start = match.end()
    prefix = data[line_start:offset]
    if line == 1 and encoding == "utf-8-sig" and prefix.startswith(codecs.BOM_UTF8):
        prefix = prefix[len(codecs.BOM_UTF8) :]
    try:
        col = len(prefix.decode(encoding)) + 1
    except (UnicodeDecodeError, LookupError):
        col = len(prefix) + 1
    return line, col


def read_source(path) -> SourceFile:
    """Read and decode a Python file, honouring a UTF-8 BOM and a PEP 263 coding cookie.

    Raises SourceError for a file that cannot be read, holds NUL bytes, or does not decode; the
    position is that of the first offending byte.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _os_error(path, exc, "cannot read file") from exc
    return decode_source(path, data)


def decode_source(path: Path, data: bytes) -> SourceFile:
    """`read_source` for bytes already read (check reads every file once, for its byte scan)."""
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _position(data, nul, "latin-1")
        raise SourceError(path, line, col, BINARY, "binary file (NUL byte): not Python source")

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding declaration" in str(exc.msg):
            # No cookie, and the first lines are not UTF-8: decoding below locates the bad byte.
            encoding = "utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8"
        else:
            # An unknown codec in the cookie, or a cookie that contradicts a BOM.
            line = 1 if _COOKIE.match(data.split(b"\n", 1)[0]) else 2
            raise SourceError(path, line, 1, UNDECODABLE, f"{exc.msg}; fix the coding cookie") from exc
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        start = exc.start
        if encoding == "utf-8-sig" and data.startswith(codecs.BOM_UTF8):
            start += len(codecs.BOM_UTF8)  # the utf-8-sig decoder counts from after the BOM
        line, col = _position(data, start, encoding)
        declared = "" if encoding.startswith("utf-8") else " (declared by the coding cookie)"
        raise SourceError(
            path,
            line,
            col,
            UNDECODABLE,
            f"byte 0x{data[start]:02x} is not valid {exc.encoding}{declared}; "
            "re-save the file in that encoding or fix its coding cookie",
        ) from exc
    return SourceFile(path=path, data=data, text=text, encoding=encoding)


def _excluded(name: str, relative: str, exclude: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(relative, p) for p in exclude)


def iter_python_files(paths: Iterable, exclude: Iterable[str] = ()) -> Iterator[Path | SourceError]:
    """Yield the `.py` files under `paths` in sorted order, and a SourceError for each bad entry
    (`python_files` without the stat results)."""
    for item, _ in python_files(paths, exclude):
        yield Path(item) if isinstance(item, str) else item


def python_files(paths: Iterable, exclude: Iterable[str] = ()) -> list[tuple[str | SourceError, os.stat_result | None]]:
    """The `.py` files under `paths` in sorted order as path strings (a Path per file costs more than
    the walk's system calls on a large tree), each with its stat result (None for an error).

    Directories in SKIPPED_DIRS and entries matching an `exclude` glob (against the name or the
    POSIX path relative to the given root) are skipped. Symlinked directories are followed once;
    one that leads back into its own ancestry yields a SYMLINK_LOOP error. A file named
    explicitly is always yielded (reading it later reports what is wrong with it). Each file is
    yielded once even when reachable through several links.
    """
    exclude = tuple(exclude)
    found: list[tuple[str, str | SourceError, os.stat_result | None]] = []
    seen_files: set[tuple[int, int]] = set()
    seen_dirs: set[tuple[int, int]] = set()

    def add_file(path: str, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if key not in seen_files:
            seen_files.add(key)
            found.append((path, path, st))

    def error(path: str, exc: OSError) -> None:
        found.append((path, _os_error(Path(path), exc), None))

    # Plain strings, not Path objects, while walking: pathlib costs more than the syscalls here.
    def walk(directory: str, relative: str, ancestors: tuple[tuple[int, int], ...]) -> None:
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            found.append(
                (
                    directory,
                    SourceError(
                        Path(directory), 1, 1, UNREADABLE,
                        f"cannot list directory: {exc.strerror or exc}",
                    ),
                    None,
                )
            )
            return
        for entry in entries:
            name = entry.name
            rel = f"{relative}{name}"
            if exclude and _excluded(name, rel, exclude):
                continue
            try:
                is_dir = entry.is_dir()  # follows symlinks
            except OSError:
                is_dir = False
            if is_dir:
                if name in SKIPPED_DIRS:
                    continue
                try:
                    st = entry.stat()
                except OSError as exc:
                    error(entry.path, exc)
                    continue
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    found.append((entry.path, _loop_error(Path(entry.path)), None))
                elif key not in seen_dirs:
                    seen_dirs.add(key)
                    walk(entry.path, rel + "/", ancestors + (key,))
            elif name.endswith(".py"):
                try:
                    st = entry.stat()
                except OSError as exc:
                    error(entry.path, exc)
                    continue
                if stat.S_ISREG(st.st_mode):
                    add_file(entry.path, st)

    for given in paths:
        given = os.fspath(given)
        try:
            st = os.stat(given)
        except OSError as exc:
            error(given, exc)
            continue
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key not in seen_dirs:
                seen_dirs.add(key)
                walk(given, "", (key,))
        else:
            add_file(given, st)

    walk = None  # the recursive closure is a cycle that would keep `found` for the collector (off in check)
    found.sort(key=lambda item: item[0])
    return [(item, st) for _, item, st in found]


def _loop_error(path: Path) -> SourceError:
    try:
        link = f" -> {os.readlink(path)}"
    except OSError:
        link = ""
    return SourceError(
        path, 1, 1, SYMLINK_LOOP,
        f"symbolic link loop: {path.name}{link} leads back into its own parent directory; not followed",
    )


def _os_error(path: Path, exc: OSError, what: str = "cannot read") -> SourceError:
    if exc.errno == errno.ELOOP:
        return SourceError(path, 1, 1, SYMLINK_LOOP, "symbolic link loop: the link resolves to itself")
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return SourceError(path, 1, 1, UNREADABLE, f"broken symbolic link to {os.readlink(path)}")
    if isinstance(exc, IsADirectoryError):
        return SourceError(path, 1, 1, UNREADABLE, "is a directory, not a file")
    return SourceError(path, 1, 1, UNREADABLE, f"{what}: {exc.strerror or exc}")


def write_atomic(path, data: bytes) -> bool:
    """Replace the file's bytes with `data` atomically; return False (and write nothing) if equal.

    The new bytes go to a hidden temp file in the same directory, are fsynced and renamed over
    the target, so a reader (or a crash) sees either the old or the new file, never a mix. The
    file mode is kept; a symlink is written through, not replaced. On failure the temp file is
    removed, the original is untouched, and a SourceError (WRITE_FAILED) is raised.
    """
    path = Path(path)
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise SourceError(path, 1, 1, WRITE_FAILED, f"cannot stat: {exc.strerror or exc}") from exc
    if st is not None:
        try:
            if st.st_size == len(data) and target.read_bytes() == data:
                return False
        except OSError:
            pass  # unreadable but maybe writable: let the write decide

    import tempfile  # only a write needs it (and the `random` it imports): not check's start-up

    directory = target.parent
    tmp_name = None
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as tmp:
                tmp.write(data)
                tmp.flush()
                if st is not None:
                    os.fchmod(tmp.fileno(), stat.S_IMODE(st.st_mode))
                    if hasattr(os, "fchown") and (st.st_uid, st.st_gid) != _owner(tmp.fileno()):
                        try:
                            os.fchown(tmp.fileno(), st.st_uid, st.st_gid)
                        except OSError:
                            pass  # not permitted for non-root; the mode is what matters
                else:
                    umask = os.umask(0)
                    os.umask(umask)
                    os.fchmod(tmp.fileno(), 0o666 & ~umask)
                os.fsync(tmp.fileno())
            os.replace(tmp_name, target)
            tmp_name = None
        finally:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
    except OSError as exc:
        raise SourceError(
            path, 1, 1, WRITE_FAILED, f"cannot write (file left unchanged): {exc.strerror or exc}"
        ) from exc
    _fsync_directory(directory)
    return True


def _owner(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_uid, st.st_gid


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; best effort (not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
