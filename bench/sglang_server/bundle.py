"""Build the carry bundle for the real-sglang run: pinned wheels, checked by hash, split into parts.

Run on the CPU machine (it needs PyPI), from the repository root:

    python bench/sglang_server/bundle.py                    # -> .whl/sglang-server/part1 .. partN
    python bench/sglang_server/bundle.py --release 0.5.14   # -> .whl/sglang-server-0.5.14/part1 .. partN

The GPU machine has no network and takes at most 64 MiB per call, so the wheels travel in parts, one
part per call on the same warm machine. Every wheel is pinned by file name and sha256 in
``wheels.lock`` beside this script (sglang 0.5.17, the default release; another release's pins are in
``wheels-<release>.lock``); a download whose hash differs stops the build. sglang-kernel's wheel (383 MB;
615 MB for 0.5.14's 0.4.4) is repacked without the kernels an H100 run with the Triton attention backend
never loads (``TRIM`` below), and the repacked wheel is pinned by hash as well, so the trim is reproducible.
Downloads are cached outside the repository (``--cache``).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_RELEASE = "0.5.17"
LOCK = HERE / "wheels.lock"
# Each part stays under the 64 MiB a call may carry, with room for the working tree (results archives included)
# beside it.
PART_LIMIT = 48 * 2**20
PIP_TAGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64", "--platform", "any"]
# Removed from sglang-kernel: FA3 (1.1 GB unpacked), the Blackwell build and InfLLM's ops. With
# --attention-backend triton on Hopper none is imported: sgl_kernel loads sm90/common_ops, and FA3's
# import sits inside a try. 0.5.14's sglang-kernel 0.4.4 has the same layout (FA3 and sm100 there, no InfLLM ops).
TRIM = re.compile(r"^sgl_kernel/(flash_ops\.abi3\.so|infllm_ops[^/]*\.so|sm100/.*)$")


def lock_file(release: str) -> Path:
    """The pins of a release: wheels.lock for the default one, wheels-<release>.lock for another."""
    return LOCK if release == DEFAULT_RELEASE else HERE / f"wheels-{release}.lock"


def bundle_dir(release: str) -> Path:
    """Where a release's parts go: .whl/sglang-server for the default one, .whl/sglang-server-<release> for another."""
    return Path(".whl/sglang-server" if release == DEFAULT_RELEASE else f".whl/sglang-server-{release}")


def read_lock(lock: Path = LOCK) -> tuple[dict[str, str], dict[str, str]]:
    """(file name -> sha256 of the download, file name -> sha256 after the trim) from a lock file."""
    pins, trimmed = {}, {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            digest, name, *kind = line.split()
            (trimmed if kind == ["trimmed"] else pins)[name] = digest
    return pins, trimmed


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def requirement(wheel_name: str) -> str:
    """``name==version`` from a wheel file name."""
    name, version = wheel_name.split("-")[:2]
    return f"{name}=={version}"


def fetch(name: str, digest: str, cache: Path, lock: Path = LOCK) -> Path:
    path = cache / name
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_TAGS, "-d", str(cache),
                        requirement(name)], check=True)
    if not path.exists():
        sys.exit(f"bundle: pip did not produce {name} (another build of {requirement(name)}?); update {lock.name}")
    got = sha256(path)
    if got != digest:
        sys.exit(f"bundle: {path}: sha256 {got} does not match {lock.name} ({digest})")
    return path


def trim(source: Path, target: Path) -> None:
    """Repack ``source`` without the ``TRIM`` members, keeping every other entry (and its date) as is."""
    removed = set()
    with zipfile.ZipFile(source) as src, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in src.infolist():
                if TRIM.match(info.filename):
                    removed.add(info.filename)
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    # The record lists what the wheel holds: drop the removed files' lines.
                    lines = [ln for ln in data.decode().splitlines(keepends=True)
                             if ln.split(",", 1)[0] not in removed]
                    data = "".join(lines).encode()
                dst.writestr(info, data)
    os.replace(tmp.name, target)


def split(paths: list[Path]) -> list[list[Path]]:
    """First-fit decreasing into parts of at most PART_LIMIT bytes."""
    parts: list[list[Path]] = []
    sizes: list[int] = []
    for path in sorted(paths, key=lambda p: p.stat().st_size, reverse=True):
        size = path.stat().st_size
        if size > PART_LIMIT:
            sys.exit(f"bundle: {path.name} ({size} bytes) is larger than one part")
        for i, used in enumerate(sizes):
            if used + size <= PART_LIMIT:
                parts[i].append(path)
                sizes[i] += size
                break
        else:
            parts.append([path])
            sizes.append(size)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "canary-instrument" / "sglang-server-wheels")
    parser.add_argument("--release", default=DEFAULT_RELEASE,
                        help=f"the sglang release whose lock to build (default {DEFAULT_RELEASE}: wheels.lock)")
    parser.add_argument("--out", type=Path, help="default .whl/sglang-server, or .whl/sglang-server-RELEASE")
    args = parser.parse_args()
    lock = lock_file(args.release)
    args.out = args.out or bundle_dir(args.release)
    args.cache.mkdir(parents=True, exist_ok=True)
    pins, trimmed_pins = read_lock(lock)
    wheels = []
    for name, digest in pins.items():
        path = fetch(name, digest, args.cache, lock)
        if name in trimmed_pins:
            trimmed = args.cache / "trimmed" / name
            trimmed.parent.mkdir(exist_ok=True)
            if not trimmed.exists() or sha256(trimmed) != trimmed_pins[name]:
                trim(path, trimmed)
            got = sha256(trimmed)
            if got != trimmed_pins[name]:
                sys.exit(f"bundle: {name} trimmed has sha256 {got}, {lock.name} pins {trimmed_pins[name]}")
            path = trimmed
        wheels.append(path)
    if args.out.exists():
        shutil.rmtree(args.out)
    manifest = []
    for i, part in enumerate(split(wheels), 1):
        folder = args.out / f"part{i}"
        folder.mkdir(parents=True)
        for path in part:
            shutil.copyfile(path, folder / path.name)
            manifest.append(f"{sha256(folder / path.name)}  part{i}/{path.name}")
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{folder}: {len(part)} wheels, {size / 2**20:.1f} MiB")
    (args.out / "SHA256SUMS").write_text("\n".join(manifest) + "\n")
    print(f"{args.out}/SHA256SUMS: {len(manifest)} wheels; carry each part in its own call (README.md)")


if __name__ == "__main__":
    main()
