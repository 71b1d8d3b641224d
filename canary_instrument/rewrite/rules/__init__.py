"""The rules of `check` and `apply`: one module per finding code, its documentation in its docstring.

A rule module holds `CODE` and, for a rule that one file decides, `check(parsed, catalog, report)`,
which adds its findings to the file's `FileReport`. Whole-tree rules (CI102, CI209, CI301) are run
by check's tree pass; CI207 only by `apply`. `RULES` lists every module in code order; docs/cli.md's
finding-code table is generated from it (`python -m canary_instrument.rewrite.rules.doc`).
"""

from __future__ import annotations

from canary_instrument.rewrite.rules import (
    ci101_missing_placeholder,
    ci102_site_not_found,
    ci103_stray_placeholder,
    ci104_duplicated_placeholder,
    ci105_incomplete_placeholder,
    ci106_hand_written,
    ci107_unknown_hand_wiring,
    ci108_ambiguous_role,
    ci201_unwired_site,
    ci202_hook_missing,
    ci203_hook_without_wiring,
    ci204_member_mismatch,
    ci205_stale_wiring,
    ci206_manager_conflict,
    ci207_undefined_in_wiring,
    ci208_unreachable_manager,
    ci209_hook_not_placed,
    ci301_uncovered_forward,
)

RULES = (
    ci101_missing_placeholder,
    ci102_site_not_found,
    ci103_stray_placeholder,
    ci104_duplicated_placeholder,
    ci105_incomplete_placeholder,
    ci106_hand_written,
    ci107_unknown_hand_wiring,
    ci108_ambiguous_role,
    ci201_unwired_site,
    ci202_hook_missing,
    ci203_hook_without_wiring,
    ci204_member_mismatch,
    ci205_stale_wiring,
    ci206_manager_conflict,
    ci207_undefined_in_wiring,
    ci208_unreachable_manager,
    ci209_hook_not_placed,
    ci301_uncovered_forward,
)

# The per-file checks, resolved once: check calls each on every analysed file.
FILE_CHECKS = tuple(rule.check for rule in RULES if hasattr(rule, "check"))
