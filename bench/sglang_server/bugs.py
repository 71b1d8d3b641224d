"""Small bugs in sglang's own KV bookkeeping, for running the real server with them (issue 36's corpus).

    python bench/sglang_server/bugs.py SRC_PACKAGE DEST_PACKAGE BUG     # a copy of the package, with BUG in it
    python bench/sglang_server/bugs.py --list

Each bug is one edit of the release's source: the exact text it replaces and what it puts there, so a
release whose code moved is refused (exit 1) rather than patched somewhere else. The copy is the package
as given (unmodified for canary off and sglang's own canary, the instrumented one for ours).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bug:
    path: str  # under the package's srt/
    old: str
    new: str
    what: str


BUGS = {
    # Every decode step writes each request's new slot one position early in req_to_token: the previous
    # token's entry is overwritten and the new position keeps whatever it held. Attention reads a wrong
    # slot at every step for every request: the flood.
    "decode_table_shift": Bug(
        "mem_cache/allocation.py",
        "        locs = seq_lens_gpu.clone()\n",
        "        locs = seq_lens_gpu - 1\n",
        "decode's req_to_token write lands one position early",
    ),
    # Prefix matching hands back one slot too few for every node it matches whole: the request's prefix
    # indices and the node it locks disagree.
    "radix_match_short": Bug(
        "mem_cache/radix_cache.py",
        "            else:\n                value.append(child.value)\n                node = child\n",
        "            else:\n                value.append(child.value[:-1] if len(child.value) > 1 else child.value)\n"
        "                node = child\n",
        "radix prefix match returns one slot short per whole node",
    ),
}


def apply(package: Path, name: str) -> None:
    bug = BUGS[name]
    path = package / "srt" / bug.path
    text = path.read_text()
    if text.count(bug.old) != 1:
        raise SystemExit(f"bugs: {name}: {path} holds the text it replaces {text.count(bug.old)} times, not once")
    path.write_text(text.replace(bug.old, bug.new))


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        for name, bug in BUGS.items():
            print(f"{name}: {bug.what} ({bug.path})")
        return 0
    if len(argv) != 3 or argv[2] not in BUGS:
        print(f"usage: bugs.py SRC_PACKAGE DEST_PACKAGE BUG (one of {', '.join(BUGS)})", file=sys.stderr)
        return 2
    source, dest, name = Path(argv[0]), Path(argv[1]), argv[2]
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, symlinks=True)
    apply(dest, name)
    print(f"bugs: {dest}: {BUGS[name].what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
