"""CI209 hook-not-placed.

Reports: a hook the tree's wiring needs (the install and init-finished of a model runner's manager, the draft
worker's init-finished) has a place in no file read; reported at the first site that needs it, with the shape
its place must have

Why: Wired sites need their manager installed and started; a hook with no place leaves them without one.

Fix: add the statement by hand where it belongs, or extend the hook in the catalog
"""

from __future__ import annotations

from canary_instrument.rewrite.findings import HOOK_NOT_PLACED

CODE = HOOK_NOT_PLACED
# A whole-tree rule, reported with CI102 by `rules.ci102_site_not_found.tree_check`.
