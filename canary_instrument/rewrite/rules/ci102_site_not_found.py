"""CI102 site-not-found.

Reports: a file matches a role's catalog path, but none of its candidate class/method/statement shapes is in it
(and no other file has the role)

Why: The catalog says the role lives in this file; a role found nowhere means the tree changed shape and the
site would silently go unwired.

Fix: extend the catalog
"""

from __future__ import annotations

from canary_instrument.catalog import Catalog, Hook
from canary_instrument.rewrite.analysis.placement import Placement
from canary_instrument.rewrite.findings import HOOK_NOT_PLACED, SITE_NOT_FOUND, Finding

CODE = SITE_NOT_FOUND
# A whole-tree rule over every file's placement: CI209's findings come from the same pass (a hook that no
# file of the tree has a place for is reported at the first site that needs it, with what its place would
# have to look like).


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


def tree_check(placements: list[Placement], catalog: Catalog) -> list[Finding]:
    """CI102 for each role expected at a path and found nowhere; CI209 for each needed hook placed nowhere
    (a hook role reported as CI102 is not reported again as CI209). `apply` and `check` share it, so both
    exit 1 for the same unplaced roles."""
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
                placement.path, 1, 1, CODE,
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
                placement.path, line, col, HOOK_NOT_PLACED,
                f"{role} hook not placed: {site} needs `{statement}`, but {_place_wanted(hook, catalog)} "
                "in the files read; add the statement where it belongs, or extend the catalog's hook "
                "(--catalog or [tool.canary-instrument])",
            ))
    return out
