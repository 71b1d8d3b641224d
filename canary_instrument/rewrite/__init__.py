"""The rewriter: locate catalogued sites, check them, and scaffold, apply or revert their wiring.

`check_tree` needs only the standard library; the transforms import libcst when first used.
Each function returns a RunResult (findings, errors, changes) and prints nothing.
"""

from importlib import import_module

_EXPORTS = {
    "check_tree": "canary_instrument.rewrite.check",
    "scaffold_tree": "canary_instrument.rewrite.transforms.scaffold",
    "apply_tree": "canary_instrument.rewrite.transforms.apply",
    "revert_tree": "canary_instrument.rewrite.transforms.revert",
    "RunResult": "canary_instrument.rewrite.analysis.tree",
    "FileChange": "canary_instrument.rewrite.analysis.tree",
    "Finding": "canary_instrument.rewrite.findings",
    "SourceError": "canary_instrument.rewrite.io.files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
