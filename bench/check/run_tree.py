"""Run `canary-instrument` from a given source tree, ignoring an editable install (before/after timings).

    python bench/check/run_tree.py TREE check --no-cache SRT
"""

import sys

tree, *args = sys.argv[1:]
# An editable install's finder would resolve the package to the installed checkout whatever the path says.
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "") and "editable" not in repr(f)]
sys.path.insert(0, tree)
from canary_instrument import cli  # noqa: E402

sys.argv = ["canary-instrument", *args]
getattr(cli, "run", cli.main)()  # the console script's entry (`run`; `main` in trees before it)
