"""CI101 missing-placeholder.

Reports: a catalogued site holds no placeholder

Why: Apply wires placeholders: a site without one stays unguarded, its KV reads unchecked, until scaffold gives
it one.

Fix: `canary-instrument scaffold`
"""

from canary_instrument.rewrite.findings import MISSING_PLACEHOLDER as CODE  # noqa: F401 (the row's code)

SITES, AT = "missing", "first"
MESSAGE = (
    "{match.site.role} site in {match.where} has no `{match.placeholder}` placeholder; "
    "run `canary-instrument scaffold`"
)
# What apply reports for a site it cannot wire for want of a placeholder.
LEFT_ALONE = "{match.site.role} site in {match.where} has no placeholder; run `canary-instrument scaffold` first"
