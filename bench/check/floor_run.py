"""Run `canary-instrument check` from a source tree with its analysis taken out: the floor under issue 22's bar.

What is left is what any check of the tree pays before a rule runs: interpreter start-up, the imports,
the walk, reading and byte-scanning every file on two cores (the same `Pair` as check), and `ast.parse`
of the files the rules would analyse. No site or hook analysis, no reach facts, no caller search and no
call graph; the output means nothing. `trees_cold.py --floor` times it beside the full check and ast-grep.

    python bench/check/floor_run.py TREE SRT
"""

import sys

from run_tree import use_tree  # this folder's: the tool imported from the given tree

tree, srt = sys.argv[1:]
use_tree(tree)
from canary_instrument import cli  # noqa: E402
from canary_instrument.rewrite import scan  # noqa: E402
from canary_instrument.rewrite.report import FileReport  # noqa: E402


def parse_only(self, path, data, needs):
    """`Scan.analyse` without the analysis: read, decode and parse (the tree kept, as a CLI check keeps it)."""
    try:
        source = scan.read_source(path) if data is None else scan.decode_source(path, data)
        tree = scan.parse_source(source)
    except scan.SourceError as error:
        return error
    if self._parsed is not None:
        self._parsed.append((tree, None))
    return FileReport(path=path)


scan.Scan.analyse = parse_only
scan.Scan.handed_off = lambda self: None
scan.Scan.expand = lambda self: None
sys.argv = ["canary-instrument", "check", "--no-cache", srt]
cli.run()
