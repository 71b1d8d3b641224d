"""CI108 ambiguous-role.

Reports: a site whose shape fits two catalog roles that would wire it differently, equally well

Why: Two roles that fit equally well would wire the site differently; the tool never guesses which.

Fix: make one role more specific (`calls`, `requires`, `class_refs`, `loop`)
"""

from canary_instrument.rewrite.findings import AMBIGUOUS_ROLE as CODE  # noqa: F401 (the row's code)

PROBLEMS = "ambiguous"
MESSAGE = (
    "`{problem.name}` fits the catalog roles {problem.detail} equally well; make one more specific "
    "(calls, requires, class_refs, loop) in the catalog"
)
LEFT_ALONE = "`{problem.name}` fits the catalog roles {problem.detail} equally well; left alone"
