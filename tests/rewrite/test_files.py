"""Safe file IO: discovery, exact decoding with located errors, and atomic writes."""

from __future__ import annotations

import codecs
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canary_instrument.rewrite.io import files
from canary_instrument.rewrite.io.files import (
    SourceError,
    SourceFile,
    iter_python_files,
    read_source,
    write_atomic,
)

REPO = Path(__file__).resolve().parents[2]


def unprivileged(argv: list[str]) -> list[str]:
    """Run argv so that file permissions apply: root bypasses them unless it drops two capabilities."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is missing: permissions cannot be enforced")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--", *argv]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def error_of(path: Path) -> SourceError:
    with pytest.raises(SourceError) as info:
        read_source(path)
    return info.value


# --- SourceError -----------------------------------------------------------------------------


def test_source_error_formats_as_a_finding_line_and_keeps_its_fields():
    error = SourceError(Path("pkg/a.py"), 3, 7, "CI903", "byte 0xff is not valid utf-8")
    assert str(error) == "pkg/a.py:3:7: CI903 byte 0xff is not valid utf-8"
    assert (error.path, error.line, error.col, error.code, error.message) == (
        Path("pkg/a.py"), 3, 7, "CI903", "byte 0xff is not valid utf-8",
    )


def test_source_error_survives_pickling_for_process_pools():
    import pickle

    error = pickle.loads(pickle.dumps(SourceError("a.py", 1, 2, "CI901", "nope")))
    assert str(error) == "a.py:1:2: CI901 nope"


# --- read_source: decoding -------------------------------------------------------------------


def test_plain_utf8_is_read_exactly(tmp_path):
    data = "x = 'é'\n".encode()
    source = read_source(write(tmp_path / "a.py", data))
    assert source == SourceFile(path=tmp_path / "a.py", data=data, text="x = 'é'\n", encoding="utf-8")


def test_bom_is_stripped_from_text_and_restored_by_encode(tmp_path):
    data = codecs.BOM_UTF8 + b"x = 1\r\ny = 2\r\n"
    source = read_source(write(tmp_path / "a.py", data))
    assert source.data == data
    assert source.text == "x = 1\r\ny = 2\r\n"
    assert source.encoding == "utf-8-sig"
    assert source.encode(source.text) == data


def test_crlf_lone_cr_and_tabs_are_kept_in_text(tmp_path):
    data = b"if x:\r\n\ty = 1\r\n\tz = 2\rw = 3\n"
    source = read_source(write(tmp_path / "a.py", data))
    assert source.text == data.decode()
    assert source.encode(source.text) == data


def test_latin1_coding_cookie_decodes_and_round_trips(tmp_path):
    data = b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n"
    source = read_source(write(tmp_path / "a.py", data))
    assert "name = 'café'" in source.text
    assert source.encode(source.text) == data


@pytest.mark.parametrize(
    ("data", "line", "col"),
    [
        (b"\xff = 1\n", 1, 1),
        (b"a = 1\r\nb = '\xc3\xa9\xff'\n", 2, 7),  # the column counts characters, not bytes
        (b"a = 1\rb = 2\rc = '\xfe'\n", 3, 6),  # a lone CR ends a line for Python too
        (codecs.BOM_UTF8 + b"s = '\xff'\n", 1, 6),  # the BOM is not a column
        (b"# coding: ascii\nx = '\xe9'\n", 2, 6),
    ],
)
def test_undecodable_bytes_are_located_at_the_first_bad_byte(tmp_path, data, line, col):
    error = error_of(write(tmp_path / "bad.py", data))
    assert (error.line, error.col, error.code) == (line, col, files.UNDECODABLE)
    assert str(error).startswith(f"{tmp_path / 'bad.py'}:{line}:{col}: CI903 ")


def test_unknown_coding_cookie_points_at_the_cookie_line(tmp_path):
    error = error_of(write(tmp_path / "a.py", b"#!/usr/bin/python\n# coding: klingon\nx = 1\n"))
    assert (error.line, error.col, error.code) == (2, 1, files.UNDECODABLE)
    assert "klingon" in error.message


def test_nul_bytes_mark_a_binary_file(tmp_path):
    error = error_of(write(tmp_path / "blob.py", b"x = 1\nab\x00\x01\x02"))
    assert (error.line, error.col, error.code) == (2, 3, files.BINARY)


def test_unreadable_file_is_a_located_error(tmp_path):
    target = write(tmp_path / "secret.py", b"x = 1\n")
    target.chmod(0)
    tmp_path.chmod(0o755)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from canary_instrument.rewrite.io.files import read_source, SourceError\n"
        "try:\n    read_source(sys.argv[2])\nexcept SourceError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        unprivileged([sys.executable, "-c", script, str(REPO), str(target)]),
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out == f"{target}:1:1: CI901 cannot read file: Permission denied"


def test_missing_file_and_directory_are_located_errors(tmp_path):
    assert error_of(tmp_path / "gone.py").code == files.UNREADABLE
    (tmp_path / "pkg.py").mkdir()
    assert "directory" in error_of(tmp_path / "pkg.py").message


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
    bom=st.booleans(),
)
def test_any_decodable_file_round_trips_byte_for_byte(tmp_path_factory, text, bom):
    data = (codecs.BOM_UTF8 if bom else b"") + text.encode()
    path = write(tmp_path_factory.mktemp("rt") / "a.py", data)
    try:
        source = read_source(path)
    except SourceError as error:
        # Text that happens to start with a bad coding cookie is legitimately refused.
        assert error.code == files.UNDECODABLE and "coding" in text
        return
    assert source.encode(source.text) == data


# --- iter_python_files -----------------------------------------------------------------------


def tree(root: Path, names: list[str]) -> Path:
    for name in names:
        write(root / name, b"x = 1\n")
    return root


def test_walk_is_sorted_and_skips_tool_and_build_directories(tmp_path):
    tree(tmp_path, [
        "b.py", "a.py", "pkg/z.py", "pkg/m.py", "notes.txt", "pkg/data.pyc",
        ".git/hooks/x.py", ".venv/lib/x.py", "venv/x.py", "pkg/__pycache__/x.py", "build/x.py",
        "dist/x.py", "node_modules/x.py", ".tox/x.py", ".hg/x.py",
    ])
    assert list(iter_python_files([tmp_path])) == [
        tmp_path / "a.py", tmp_path / "b.py", tmp_path / "pkg/m.py", tmp_path / "pkg/z.py",
    ]


def test_exclude_globs_match_names_and_relative_paths(tmp_path):
    tree(tmp_path, ["keep.py", "gen_x.py", "vendor/lib.py", "pkg/tests/t.py", "pkg/a.py"])
    found = list(iter_python_files([tmp_path], exclude=["gen_*", "vendor", "pkg/tests"]))
    assert found == [tmp_path / "keep.py", tmp_path / "pkg/a.py"]


def test_explicit_paths_are_always_yielded(tmp_path):
    tree(tmp_path, ["build/generated.py", "script"])
    explicit = [tmp_path / "script", tmp_path / "build/generated.py"]
    assert list(iter_python_files(explicit, exclude=["generated.py"])) == sorted(explicit)


def test_missing_path_yields_an_error_and_the_rest_is_still_walked(tmp_path):
    tree(tmp_path, ["a.py"])
    found = list(iter_python_files([tmp_path / "nope", tmp_path]))
    assert found[0] == tmp_path / "a.py"
    assert isinstance(found[1], SourceError) and found[1].code == files.UNREADABLE


def test_symlinked_directory_is_followed_once(tmp_path):
    tree(tmp_path, ["real/a.py"])
    (tmp_path / "alias").symlink_to("real", target_is_directory=True)
    found = list(iter_python_files([tmp_path]))
    assert found == [tmp_path / "alias/a.py"]  # one file, reached first (sorted) through the link


def test_symlink_loop_is_reported_and_the_walk_continues(tmp_path):
    tree(tmp_path, ["pkg/a.py", "z.py"])
    (tmp_path / "pkg/up").symlink_to("..", target_is_directory=True)
    (tmp_path / "self.py").symlink_to("self.py")
    found = list(iter_python_files([tmp_path]))
    errors = [f for f in found if isinstance(f, SourceError)]
    assert [f for f in found if not isinstance(f, SourceError)] == [tmp_path / "pkg/a.py", tmp_path / "z.py"]
    assert [(e.path, e.code) for e in errors] == [
        (tmp_path / "pkg/up", files.SYMLINK_LOOP),
        (tmp_path / "self.py", files.SYMLINK_LOOP),
    ]
    assert str(errors[0]).startswith(f"{tmp_path / 'pkg/up'}:1:1: CI904 symbolic link loop")


def test_file_reached_twice_is_yielded_once(tmp_path):
    tree(tmp_path, ["a.py"])
    (tmp_path / "b.py").symlink_to("a.py")
    assert list(iter_python_files([tmp_path, tmp_path / "a.py"])) == [tmp_path / "a.py"]


# --- write_atomic ----------------------------------------------------------------------------


def test_unchanged_file_is_not_rewritten(tmp_path):
    path = write(tmp_path / "a.py", b"x = 1\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.stat()
    assert write_atomic(path, b"x = 1\n") is False
    after = path.stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)


@pytest.mark.parametrize("mode", [0o644, 0o755, 0o600, 0o664])
def test_changed_file_is_replaced_with_its_mode_kept_and_no_temp_left(tmp_path, mode):
    path = write(tmp_path / "a.py", b"x = 1\n")
    path.chmod(mode)
    inode = path.stat().st_ino
    assert write_atomic(path, b"x = 2\r\n") is True
    assert path.read_bytes() == b"x = 2\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert path.stat().st_ino != inode  # replaced by rename, not written in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_new_file_gets_the_umask_default_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        assert write_atomic(tmp_path / "new.py", b"x = 1\n") is True
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.py").stat().st_mode) == 0o644


def test_symlinked_file_is_written_through_and_the_link_kept(tmp_path):
    target = write(tmp_path / "real.py", b"x = 1\n")
    link = tmp_path / "link.py"
    link.symlink_to("real.py")
    assert write_atomic(link, b"x = 2\n") is True
    assert link.is_symlink() and target.read_bytes() == b"x = 2\n"


@pytest.mark.parametrize("failing", ["fsync", "replace", "fchmod"])
def test_failure_mid_write_leaves_the_original_intact(tmp_path, monkeypatch, failing):
    path = write(tmp_path / "a.py", b"original\n")
    path.chmod(0o640)

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, failing, boom)
    with pytest.raises(SourceError) as info:
        write_atomic(path, b"new contents\n")
    monkeypatch.undo()
    assert info.value.code == files.WRITE_FAILED
    assert str(info.value) == f"{path}:1:1: CI905 cannot write (file left unchanged): No space left on device"
    assert path.read_bytes() == b"original\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_interrupt_mid_write_removes_the_temp_file(tmp_path, monkeypatch):
    path = write(tmp_path / "a.py", b"original\n")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, b"new\n")
    monkeypatch.undo()
    assert path.read_bytes() == b"original\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_read_only_directory_is_a_located_error_and_nothing_changes(tmp_path):
    folder = tmp_path / "ro"
    path = write(folder / "a.py", b"x = 1\n")
    folder.chmod(0o555)
    tmp_path.chmod(0o755)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from canary_instrument.rewrite.io.files import write_atomic, SourceError\n"
        "try:\n    write_atomic(sys.argv[2], b'x = 2\\n')\nexcept SourceError as e:\n    print(e)\n"
    )
    try:
        out = subprocess.run(
            unprivileged([sys.executable, "-c", script, str(REPO), str(path)]),
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    finally:
        folder.chmod(0o755)
    assert out == f"{path}:1:1: CI905 cannot write (file left unchanged): Permission denied"
    assert path.read_bytes() == b"x = 1\n"
    assert sorted(p.name for p in folder.iterdir()) == ["a.py"]
