"""Give a found site its catalog role from the shape around it, never from class or method names.

A role admits a site when the site is used the way the role is (a `with` block or an argument
to a call), the guarded code makes one of the role's required calls, the role's loop and class
conditions hold, the site's class (or function) can reach the role's manager, and hand-written
wiring carries the role's arguments on that manager. Among the roles that admit it, the most
specific wins: more of the role's calls matched, a loop role in a loop, a class condition met,
the role's own placeholder name, matching hand-written arguments. A tie between roles that
would wire differently is an ambiguity (reported, never guessed).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from canary_instrument.catalog import Catalog, Manager, Site
from canary_instrument.rewrite.analysis.shapes import ClassFacts
from canary_instrument.rewrite.handwritten import HandWired
from canary_instrument.rewrite.syntax.calls import matched_patterns
from canary_instrument.rewrite.syntax.scopes import expand_alias


@dataclass(frozen=True)
class Context:
    """What is known about one found site, for role resolution."""

    usage: str  # "with" | "argument"
    calls: tuple[str, ...]  # dotted names of the calls the guarded code (or receiving call) makes
    loop_index: str | None
    facts: ClassFacts | None  # the site's class; None in a module-level function
    runner: str | None  # module-level function: how it reaches a model runner
    placeholder: str
    handwired: HandWired | None
    aliases: dict
    hinted: frozenset[str] = frozenset()  # roles whose location hints name this file, class and method


def scoped_manager(manager: Manager, runner: str | None) -> Manager | None:
    """The manager as a module-level function spells it: its owner replaced by the function's model runner."""
    if runner is None:
        return manager
    owner = manager.owner

    def swap(text):
        if text is None:
            return None
        if owner == "self":
            return runner + text[len("self"):] if text.startswith("self.") or text == "self" else text
        return runner + text[len(owner):] if text == owner or text.startswith(owner + ".") else text

    return Manager(manager.name, swap(manager.expression), swap(manager.guard))


def draft_flag(catalog: Catalog) -> str | None:
    """The attribute a guard reads to tell a draft model runner (`is_draft_worker`), as a constructor keyword."""
    return next(iter(sorted(m.guard.rpartition(".")[2] for m in catalog.managers.values() if m.guard)), None)


def held_owner(manager: Manager, facts: ClassFacts | None, catalog: Catalog) -> str | None:
    """The class's own spelling of the manager's owner when it holds that model runner under another name."""
    if facts is None:
        return None
    return facts.held_as(manager.owner, catalog.model_runner, draft_flag(catalog))


def class_manager(manager: Manager, facts: ClassFacts | None, catalog: Catalog) -> Manager:
    """The manager as the class spells it: the catalog's owner replaced by the attribute the class holds it in."""
    held = held_owner(manager, facts, catalog)
    return manager if held is None else rename_owner(manager, manager.owner, held)


def rename_owner(manager: Manager, old: str, new: str) -> Manager:
    def swap(text):
        if text is None:
            return None
        return new + text[len(old):] if text == old or text.startswith(old + ".") else text

    return Manager(manager.name, swap(manager.expression), swap(manager.guard))


def owner_spellings(facts: ClassFacts | None, catalog: Catalog) -> dict[str, str]:
    """{the class's attribute: the catalog's owner} for each manager owner the class holds under another name."""
    found = {}
    for manager in catalog.managers.values():
        held = held_owner(manager, facts, catalog)
        if held is not None:
            found[held] = manager.owner
    return found


def in_catalog_spelling(calls, spellings: dict[str, str]) -> tuple[str, ...]:
    """Call names with the class's own owner attributes spelled as the catalog's patterns name them."""
    if not spellings:
        return tuple(calls)
    out = []
    for name in calls:
        for held, owner in spellings.items():
            if name.startswith(held + "."):
                name = owner + name[len(held):]
                break
        out.append(name)
    return tuple(out)


def _owner_reachable(manager: Manager, context: Context, catalog: Catalog) -> bool:
    if context.facts is not None:
        return context.facts.reaches(manager.owner) or held_owner(manager, context.facts, catalog) is not None
    if context.runner is None:
        return False
    last = manager.owner.rpartition(".")[2]
    return manager.owner == "self" or any(fnmatchcase(last, p) for p in catalog.model_runner.names)


def _hand_owner_matches(manager: Manager, context: Context, catalog: Catalog) -> bool:
    wired = context.handwired
    if wired is None:
        return True
    have = expand_alias(wired.manager, context.aliases).rpartition(".")[0]
    if context.facts is not None:
        return have in (manager.owner, held_owner(manager, context.facts, catalog))
    return have == expand_alias(context.runner or "", context.aliases)


def score(site: Site, context: Context, catalog: Catalog) -> int | None:
    """How specifically `site` describes the found site, or None when the role does not admit it."""
    if (site.shape == "argument") != (context.usage == "argument"):
        return None
    if not site.calls:
        if context.placeholder != site.placeholder:
            return None  # a role that names no call is its placeholder's alone
    elif not matched_patterns(context.calls, site.required):
        return None
    if site.loop and context.loop_index is None:
        return None
    hinted = site.role in context.hinted
    if site.class_refs and not hinted and (context.facts is None or not context.facts.refers_to(site.class_refs)):
        return None
    manager = catalog.managers[site.manager]
    # A location hint vouches for the manager of a class that does not spell its owner out.
    reachable = hinted or _owner_reachable(manager, context, catalog)
    if not reachable or not _hand_owner_matches(manager, context, catalog):
        return None
    wired = context.handwired
    if wired is not None and site.evidence and set(site.evidence) != wired.evidence:
        return None
    points = 2 * len(matched_patterns(context.calls, site.calls))
    if site.loop:
        points += 3
    if site.class_refs:
        points += 3
    if site.placeholder == context.placeholder:
        points += 1
    if site.role in context.hinted:
        points += 1
    if wired is not None and site.evidence:
        points += 2
    return points


@dataclass(frozen=True)
class Resolution:
    site: Site | None
    rivals: tuple[Site, ...] = ()  # equally specific roles that would wire differently


def resolve(context: Context, catalog: Catalog) -> Resolution:
    scored = [(points, site) for site in catalog.sites if (points := score(site, context, catalog)) is not None]
    if not scored:
        return Resolution(None)
    best = max(points for points, _ in scored)
    winners = [site for points, site in scored if points == best]
    first = winners[0]
    rivals = tuple(
        site for site in winners[1:] if (site.wiring, site.manager) != (first.wiring, first.manager)
    )
    return Resolution(first, rivals)


def suggest_entry(context: Context, catalog: Catalog, function_name: str) -> str:
    """A one-line `[tool.canary-instrument]` catalog entry that covers a hand-written site no role admits."""
    wired = context.handwired
    role = function_name.strip("_") or "site"
    calls = sorted({name.rpartition(".")[2] for name in context.calls if not name.endswith("()")})[:3] or ["?"]
    manager = "?"
    if wired is not None:
        owner = expand_alias(wired.manager, context.aliases).rpartition(".")[0]
        for name, candidate in catalog.managers.items():
            mine = scoped_manager(candidate, context.runner)
            if (context.facts is not None and candidate.owner == owner) or (
                context.facts is None and mine.owner == expand_alias(context.runner or "", context.aliases)
            ):
                manager = name
                break
    arguments = []
    evidence = []
    loop = False
    if wired is not None:
        if wired.forward_batch:
            arguments.append(wired.forward_batch)
        if wired.outside:
            arguments.append(f"outside={wired.outside}")
            evidence.append("outside")
        if wired.active:
            active = wired.active
            if context.loop_index is not None and active == context.loop_index:
                active, loop = "{loop_index}", True
            arguments.append(f"active={active}")
            evidence.append("active")
    fields = [
        ("role", role),
        ("placeholder", context.placeholder),
        ("shape", "argument" if context.usage == "argument" else "wrap"),
        ("calls", calls),
        ("manager", manager),
        ("evidence", evidence),
        ("wiring", f"self.{catalog.member}({', '.join(arguments)})"),
    ]
    if loop:
        fields.append(("loop", True))
    import json  # here, not at the top: few runs suggest an entry, and check's import cost counts

    body = ", ".join(f"{key} = {json.dumps(value)}" for key, value in fields)
    return f"sites = [{{ {body} }}]"
