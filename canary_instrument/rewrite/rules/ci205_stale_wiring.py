"""CI205 stale-wiring.

Reports: a wired site differs from what the catalog generates (stale wiring)

Why: Wiring that differs from what the catalog generates was edited by hand or generated from an older catalog.

Fix: `apply`
"""

from canary_instrument.rewrite.findings import STALE_WIRING as CODE
from canary_instrument.rewrite.rules.select import Reported

check = Reported(
    CODE, "sites", lambda match: match.state == "wired" and not match.conforms(), at="anchor",
    message=lambda match: f"{match.site.role} site in {match.where} is wired differently from the catalog "
    f"({match.wiring()}); run `canary-instrument apply`",
).check
