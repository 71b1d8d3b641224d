"""Each file's placement facts: the roles expected and located in it, the hooks its sites need and those
it places. A site's wiring needs the hooks that make its manager exist and start checking: the hooks
scoped to its manager (the draft worker's init-finished), or, for a site on a model runner's own manager,
the model-runner hooks (the install and init-finished). Plain data only: check caches it. The rules over
the whole tree's placements (CI102, CI209) are `rules.ci102_site_not_found.tree_check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.catalog import Catalog, Hook


@dataclass
class Placement:
    """What one file contributes to the tree's placement rules."""

    path: Path
    roles_expected: set[str] = field(default_factory=set)  # roles with a candidate location at this path
    roles_located: set[str] = field(default_factory=set)  # roles whose site or hook is in this file
    needs: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # hook role -> (line, col, the site)
    placed: set[str] = field(default_factory=set)  # hook roles with a place or a statement in this file


def hooks_needed(catalog: Catalog, manager: str) -> list[Hook]:
    """The hooks a site on `manager` cannot work without."""
    own = [hook for hook in catalog.hooks if hook.scope == "manager" and hook.manager == manager]
    if own:  # a manager of its own (the draft runner's): the install makes it, its own hook starts it
        return own + [hook for hook in catalog.hooks if hook.scope == "model_runner" and hook.place == "after_assign"]
    return [hook for hook in catalog.hooks if hook.scope == "model_runner"]


def placement_of(path: Path, analysis, catalog: Catalog, position) -> Placement:
    """A file's placement facts from its analysis (`position(node)`: 1-based line and column)."""
    placement = Placement(
        path=path,
        roles_expected=set(analysis.roles_expected),
        roles_located={m.site.role for m in analysis.sites} | {h.hook.role for h in analysis.hooks}
        | analysis.roles_reported,
        placed={h.hook.role for h in analysis.hooks if h.anchor is not None or h.present},
    )
    for match in sorted(analysis.sites, key=lambda m: m.anchor.lineno):
        if match.state == "missing":
            continue
        for hook in hooks_needed(catalog, match.manager.name):
            if hook.role not in placement.needs:
                line, col = position(match.anchor)
                placement.needs[hook.role] = (line, col, f"the {match.site.role} site in {match.where}")
    return placement
