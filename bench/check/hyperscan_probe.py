"""What a multi-word scanner library would spare a cold `check`: Hyperscan deciding which files hold which words.

check's byte work is one `bytes.find` pass over every file per word: the prefilter's words, then each
caller-search round's needles. With the `hyperscan` package installed (not a dependency of the tool),
this runs `check --no-cache` with one Hyperscan pass per file and set of words instead: the prefilter
tests its words against the set a file holds, and a caller-search round runs its finds only in the
files that hold a needle. The rules, the regexes and the judging of each hit are check's own, unchanged,
so the output must be check's (the script says when it is not). It times both, interleaved, on one
core (`--one-core`: CPU the shared machine disturbs least) or two, with ast-grep for the ratio:

    <venv with hyperscan>/bin/python bench/check/hyperscan_probe.py --sglang 0.5.22 --rounds 11 [--one-core]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
from pathlib import Path

from run_tree import use_tree  # this folder's: the tool imported from the given tree

RUN_TREE = Path(__file__).with_name("run_tree.py")
REPO = Path(__file__).resolve().parents[2]


def database(words: list[bytes]):
    import hyperscan

    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[re.escape(w.decode("latin-1")).encode("latin-1") for w in words],
               ids=list(range(len(words))), flags=[hyperscan.HS_FLAG_SINGLEMATCH] * len(words))
    return db


def held(db, words: list[bytes], data: bytes) -> set[bytes]:
    """The words the bytes hold: one Hyperscan pass."""
    found: set[bytes] = set()
    db.scan(data, match_event_handler=lambda index, start, end, flags, context: found.add(words[index]))
    return found


def run_probe(tree: str, args: list[str]) -> None:
    """`check ARGS` from TREE, its prefilter and caller search fed by Hyperscan passes."""
    use_tree(tree)
    from canary_instrument import cli
    from canary_instrument.rewrite.io import callers, prefilter

    class Held(bytes):
        """A file's bytes whose `in` for the prefilter's words reads the set one pass found."""

        words: frozenset = frozenset()
        found: set = set()

        def __contains__(self, word) -> bool:
            return word in self.found if word in self.words else bytes.__contains__(self, word)

    make = prefilter.Prefilter.__init__
    needs = prefilter.Prefilter.needs

    def prefilter_init(self, catalog) -> None:
        make(self, catalog)
        words = {b"canary", *self._placeholders, *self._runner_words, *(w for w, _ in self._triggers),
                 *(name for name, _, _ in self._holder_assigns), *(self._draft_flag[0] if self._draft_flag else ())}
        self.probe_words = sorted(words)
        self.probe_db = database(self.probe_words)

    def prefilter_needs(self, posix: str, data: bytes) -> int:
        wrapped = Held(data)
        wrapped.words, wrapped.found = frozenset(self.probe_words), held(self.probe_db, self.probe_words, data)
        return needs(self, posix, wrapped)

    find = callers.CallerSearch.find

    def caller_find(self, wanted, two_cores: bool = True) -> set[int]:
        words = sorted({entry[1] for entry in wanted if entry[0] in ("call", "subclass", "define")})
        needles = [needle.encode() for needle, _ in callers._needles(words)]
        if not needles:
            return find(self, wanted, two_cores)
        db = database(needles)
        holding = [held(db, needles, data) for data in self._datas]
        found: set[int] = set()
        for needle in needles:  # check's own search, over the files that hold the needle (b"" elsewhere)
            only = callers.CallerSearch([d if needle in h else b"" for d, h in zip(self._datas, holding)])
            found |= find(only, {e for e in wanted if needle.decode() in e[1]}, two_cores=False)
        return found

    prefilter.Prefilter.__init__ = prefilter_init
    prefilter.Prefilter.needs = prefilter_needs
    callers.CallerSearch.find = caller_find
    sys.argv = ["canary-instrument", *args]
    cli.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", action="append", required=True, metavar="VERSION")
    parser.add_argument("--tree", default=str(REPO), help="the source tree of the tool")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--one-core", action="store_true")
    args = parser.parse_args()
    from bench_check import PATTERN, find_sglang, timed_run  # this folder's benchmark: its timing and trees

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if args.one_core else []
    tool = shutil.which("ast-grep")
    for version in args.sglang:
        srt = str(find_sglang(version) / "srt")
        commands = {
            "check": [*pin, sys.executable, str(RUN_TREE), args.tree, "check", "--no-cache", srt],
            "with hyperscan": [*pin, sys.executable, __file__, "--run", args.tree, "check", "--no-cache", srt],
        }
        outputs = {name: timed_run(command, env=env)[2].stdout for name, command in commands.items()}
        if outputs["check"] != outputs["with hyperscan"]:
            sys.exit(f"sglang {version}: the probe's output is not check's")
        walls: dict[str, list[float]] = {name: [] for name in [*commands, "ast-grep"]}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, command in commands.items():
                wall, cpu, _ = timed_run(command, env=env)
                walls[name].append(wall)
                cpus[name].append(cpu)
            if tool and not args.one_core:
                walls["ast-grep"].append(timed_run([tool, "run", "-p", PATTERN, "-l", "python", srt])[0])
        print(f"sglang {version}, {args.rounds} rounds{', one core' if args.one_core else ''}; s, min / median")
        for name in commands:
            line = (f"  {name}: wall {min(walls[name]):.3f} / {statistics.median(walls[name]):.3f}, "
                    f"CPU {min(cpus[name]):.3f} / {statistics.median(cpus[name]):.3f}")
            if walls["ast-grep"]:
                line += (" , over ast-grep per round " +
                         f"{statistics.median(w / a for w, a in zip(walls[name], walls['ast-grep'])):.3f}")
            print(line)
        ratio = statistics.median(b / a for a, b in zip(cpus["check"], cpus["with hyperscan"]))
        print(f"  CPU with hyperscan / without, per round: {ratio:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        run_probe(sys.argv[2], sys.argv[3:])
    else:
        main()
