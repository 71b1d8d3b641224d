"""The rules of `check` and `apply`: one module per finding code, its documentation in its docstring.

A rule module holds `CODE` and, for a rule that one file decides, `check(parsed, catalog, report)`,
which adds its findings to the file's `FileReport`, or the constants of a row of `select.Reported`
(the sites or problems it reports and its messages), from which that check is built. Whole-tree
rules (CI102, CI209, CI301) are run by check's tree pass; CI207 only by `apply`. `RULES` lists every module in code order; docs/cli.md's
finding-code table is generated from it (`python -m canary_instrument.rewrite.rules.doc`).
"""

from __future__ import annotations

import importlib
import pkgutil

from canary_instrument.rewrite.rules.select import Reported

# Every module named for its code (`ci<NNN>_<name>`), in code order: a new rule is a new module, nothing else.
RULES = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
    if info.name[:2] == "ci" and info.name[2:5].isdigit()
)

# The per-file checks, resolved once: check calls each on every analysed file.
FILE_CHECKS = tuple(
    rule.check if hasattr(rule, "check") else Reported.of_module(rule).check
    for rule in RULES if hasattr(rule, "check") or hasattr(rule, "MESSAGE")
)
