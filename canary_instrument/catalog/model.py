"""The site catalog as typed, validated data: roles, candidate locations, managers, hooks, triggers."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

# What the runtime module exports (docs/architecture.md, "The wiring contract").
RUNTIME_EXPORTS = ("canary_context", "install_canary", "mark_init_finished", "context_tuple")


class CatalogError(ValueError):
    """A catalog that cannot be used; the message names its source and the offending field."""


def call_matches(dotted: str, pattern: str) -> bool:
    """True when a call's dotted name (`self.a.b`) matches a catalog call pattern.

    A pattern matches the whole dotted name or any dotted suffix of it, with
    shell-style wildcards: `_forward_raw` matches `self._forward_raw`,
    `*graph_runner.replay` matches `self.cuda_graph_runner.replay`.
    """
    return fnmatchcase(dotted, pattern) or fnmatchcase(dotted, "*." + pattern)


def path_matches(posix_path: str, pattern: str) -> bool:
    """True when a file path ends with the catalog path pattern at a folder boundary."""
    return fnmatchcase(posix_path, pattern) or fnmatchcase(posix_path, "*/" + pattern)


@dataclass(frozen=True)
class Location:
    """One candidate location of a role: a file path suffix, class and method name patterns."""

    path: str
    classes: tuple[str, ...]
    methods: tuple[str, ...]
    manager: str | None = None

    def matches_path(self, posix_path: str) -> bool:
        return path_matches(posix_path, self.path)

    def matches_class(self, name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in self.classes)

    def matches_method(self, name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in self.methods)


@dataclass(frozen=True)
class Manager:
    """How a participating class reaches its canary manager, and when the canary is off there."""

    name: str
    expression: str
    guard: str | None = None


@dataclass(frozen=True)
class Site:
    """A placeholder role: where the placeholder goes and what it becomes when wired."""

    role: str
    placeholder: str
    shape: str  # "wrap" | "with_item"
    calls: tuple[str, ...]
    wiring: str  # expression; `{loop_index}` is the enclosing for-loop's variable
    candidates: tuple[Location, ...]
    item: str = "first"  # with_item: where the placeholder joins the with items
    loop: bool = False  # the site sits in a for loop whose variable the wiring uses


@dataclass(frozen=True)
class Hook:
    """A statement apply inserts after an anchor statement and revert removes."""

    role: str
    after_calls: tuple[str, ...]
    statement: str
    candidates: tuple[Location, ...]


TRIGGER_KINDS = ("forward", "graph")


@dataclass(frozen=True)
class Trigger:
    """Calls that are forward paths: check flags those reachable outside every catalogued site.

    `kind` "forward": the call is itself a KV-reading forward. "graph": a graph capture or replay,
    flagged only when the captured or replayed code reaches a KV-reading forward.
    """

    calls: tuple[str, ...]
    what: str
    kind: str = "forward"


@dataclass(frozen=True)
class KvForward:
    """What makes a call a KV-reading forward by shape: a method matching `methods` given a forward batch,
    i.e. an argument annotated with one of `batch_types` or named one of `batch_names`."""

    methods: tuple[str, ...] = ("forward*",)
    batch_types: tuple[str, ...] = ("ForwardBatch",)
    batch_names: tuple[str, ...] = ("forward_batch",)


@dataclass(frozen=True)
class Catalog:
    runtime_module: str
    member: str
    placeholder_factory: str
    managers: dict[str, Manager]
    sites: tuple[Site, ...]
    hooks: tuple[Hook, ...]
    triggers: tuple[Trigger, ...]
    exclude: tuple[str, ...]
    sources: tuple[str, ...]
    kv_forward: KvForward = KvForward()

    @property
    def placeholder_names(self) -> frozenset[str]:
        return frozenset(site.placeholder for site in self.sites)

    def locations(self):
        """Every (entry, location) pair: sites first, then hooks."""
        for entry in (*self.sites, *self.hooks):
            for location in entry.candidates:
                yield entry, location
