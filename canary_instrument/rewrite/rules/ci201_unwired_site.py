"""CI201 unwired-site.

Reports: half-wired: some site is wired but this one still holds a placeholder

Why: Wiring is all or nothing across a tree: a site left with its placeholder runs unchecked while the rest is
checked.

Fix: `apply`
"""

from canary_instrument.rewrite.findings import UNWIRED_SITE as CODE  # noqa: F401 (the row's code)

SITES, INTO = "placeholder", "when_wired"  # a finding only when some site of the tree is wired
MESSAGE = (
    "half-wired: {match.site.role} site in {match.where} still holds a placeholder while the tree is wired; "
    "run `canary-instrument apply`"
)
