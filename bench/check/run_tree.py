"""Run `canary-instrument` from a given source tree, ignoring an editable install (before/after timings).

    python bench/check/run_tree.py TREE check --no-cache SRT

The other benchmarks of this folder that import the tool from a given tree call `use_tree`.
"""

import sys


def use_tree(tree: str) -> None:
    """Make `import canary_instrument` load the package of source tree `tree`: an editable install's finder
    would resolve it to the installed checkout whatever the path says."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "") and "editable" not in repr(f)
    ]
    sys.path.insert(0, tree)


if __name__ == "__main__":
    tree, *args = sys.argv[1:]
    use_tree(tree)
    from canary_instrument import cli

    sys.argv = ["canary-instrument", *args]
    getattr(cli, "run", cli.main)()  # the console script's entry (`run`; `main` in trees before it)
