"""CI207 undefined-in-wiring.

Reports: apply: the site's wiring reads a name (e.g. `forward_batch`) that its method neither receives nor
assigns; the site is left as it is

Why: Wiring that reads an undefined name would fail when the site runs; apply leaves the site as it is rather
than write it.

Fix: fix the site's `wiring` in the catalog
"""

from __future__ import annotations

import ast
import builtins
from typing import TYPE_CHECKING

from canary_instrument.catalog import RUNTIME_EXPORTS
from canary_instrument.rewrite.findings import UNDEFINED_IN_WIRING, Finding
from canary_instrument.rewrite.syntax.nodes import parameters

if TYPE_CHECKING:
    from canary_instrument.rewrite.analysis.locate import SiteMatch
    from canary_instrument.rewrite.analysis.tree import ParsedFile

CODE = UNDEFINED_IN_WIRING


def undefined_names(match: SiteMatch) -> list[str]:
    """Names the site's wiring reads that its function neither receives nor assigns (nor are builtins)."""
    wanted = {n.id for n in ast.walk(ast.parse(match.wiring(), mode="eval")) if isinstance(n, ast.Name)}
    defined = {a.arg for a in parameters(match.method)}
    for node in ast.walk(match.method):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    return sorted(name for name in wanted - defined if name not in dir(builtins) and name not in RUNTIME_EXPORTS)


def site_finding(parsed: ParsedFile, match: SiteMatch) -> Finding | None:
    """The finding of a site apply is about to wire, None when its wiring reads only what is defined."""
    undefined = undefined_names(match)
    if not undefined:
        return None
    return parsed.finding(
        match.anchor, CODE,
        f"{match.site.role} site: the wiring `{match.wiring()}` uses {', '.join(undefined)}, which "
        f"{match.where} does not define; left as it is (fix the catalog's wiring for this site)",
    )
