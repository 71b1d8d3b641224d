"""Whole-tree placement: every role the tree expects is found, and every hook the wiring needs has a place.

`apply` and `check` share it, so both exit 1 for the same unplaced roles. A site's wiring needs the
hooks that make its manager exist and start checking: the hooks scoped to its manager (the draft
worker's init-finished), or, for a site on a model runner's own manager, the model-runner hooks (the
install and init-finished). A hook that no file of the tree has a place for is reported at the first
site that needs it, with what its place would have to look like. Roles that a catalog location
expects at a path but that the file there does not hold are CI102. Plain data only: check caches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.catalog import Catalog, Hook
from canary_instrument.rewrite import findings as codes
from canary_instrument.rewrite.findings import Finding


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


def unreachable_message(info, analysis) -> str:
    """CI208's message for a class whose sites' manager expression reads what the class never uses."""
    roles = sorted({m.site.role for m in analysis.sites if m.class_node is info.class_node})
    return (
        f"{info.class_node.name}: its {', '.join(roles)} site(s) run on the {info.manager.name} manager, "
        f"`{info.manager.expression}`, but the class never uses `{info.manager.owner}` and holds no single model "
        "runner in its place; its sites are left as they are (set the manager's expression in the catalog)"
    )


def _place_wanted(hook: Hook, catalog: Catalog) -> str:
    if hook.scope == "manager":
        scope = f"a class whose sites run on the {hook.manager} manager"
    elif hook.scope == "holder":
        scope = "a class that holds a model runner"
    else:
        scope = "a model-runner class (one that calls " + " or ".join(catalog.model_runner.class_calls) + \
            ") or a function that receives a model runner"
    if hook.place == "after_capture":
        return f"no function of {scope} captures graphs (calls {', '.join(hook.after_calls)})"
    built = ", ".join([*(f"self.{name} = ..." for name in hook.assigns), *(f"{name}(...)" for name in hook.after_calls)])
    return f"no method of {scope} builds what it follows ({built})"


def placement_findings(placements: list[Placement], catalog: Catalog) -> list[Finding]:
    """CI102 for each role expected at a path and found nowhere; CI209 for each needed hook placed nowhere."""
    located = set().union(*(p.roles_located for p in placements)) if placements else set()
    placed = set().union(*(p.placed for p in placements)) if placements else set()
    out: list[Finding] = []
    reported: set[str] = set()
    hooks = {hook.role: hook for hook in catalog.hooks}
    for placement in placements:
        for role in sorted(placement.roles_expected - located - reported):
            reported.add(role)
            why = f" ({_place_wanted(hooks[role], catalog)} in it)" if role in hooks else ""
            out.append(Finding(
                placement.path, 1, 1, codes.SITE_NOT_FOUND,
                f"{role}: this file matches the catalog's path but no candidate class, method and statement "
                f"shape is in it{why}; extend the catalog (--catalog or [tool.canary-instrument])",
            ))
    for placement in sorted(placements, key=lambda p: str(p.path)):
        for role, (line, col, site) in sorted(placement.needs.items()):
            if role in placed or role in reported:
                continue
            reported.add(role)
            hook = hooks[role]
            statement = hook.statement.replace("{model_runner}", "model_runner").replace("{value}", "...")
            out.append(Finding(
                placement.path, line, col, codes.HOOK_NOT_PLACED,
                f"{role} hook not placed: {site} needs `{statement}`, but {_place_wanted(hook, catalog)} "
                "in the files read; add the statement where it belongs, or extend the catalog's hook "
                "(--catalog or [tool.canary-instrument])",
            ))
    return out
