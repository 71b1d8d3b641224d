"""CI103 stray-placeholder.

Reports: stray placeholder: a canary-named placeholder assignment or `with` item outside every catalogued site

Why: A placeholder outside every site is never wired (or wired where no role admits it): it guards nothing the
catalog knows.

Fix: remove it, or catalogue its site
"""

from canary_instrument.rewrite.findings import STRAY_PLACEHOLDER as CODE  # noqa: F401 (the row's code)

PROBLEMS = "stray"
MESSAGE = "stray placeholder `{problem.name}` ({problem.detail}); remove it, or add its site to the catalog"
LEFT_ALONE = (
    "stray placeholder `{problem.name}` ({problem.detail}); left alone: no catalog role admits it here "
    "(remove it, or add its site to the catalog)"
)
