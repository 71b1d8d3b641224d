"""CI102 site-not-found.

Reports: a file matches a role's catalog path, but none of its candidate class/method/statement shapes is in it
(and no other file has the role)

Why: The catalog says the role lives in this file; a role found nowhere means the tree changed shape and the
site would silently go unwired.

Fix: extend the catalog
"""

from __future__ import annotations

from canary_instrument.rewrite.findings import SITE_NOT_FOUND
from canary_instrument.rewrite.analysis.placement import placement_findings

CODE = SITE_NOT_FOUND
# A whole-tree rule: `placement_findings` reports it with CI209 in one pass (a hook role reported
# here is not reported again as CI209).
tree_check = placement_findings
