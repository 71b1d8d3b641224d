"""The site catalog as typed, validated data: roles described by shape, managers, hooks, triggers, location hints.

The field types are the catalog's schema: the loader checks a TOML table against them (a `Literal`
lists the values a field takes; `EMPTY_OK` marks a list that may be empty although its default is not).
They are evaluated when the classes are made (no postponed annotations), so the loader reads them as
they are instead of resolving strings on every run.
"""

from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Literal

# The catalog package re-exports these (catalog/__init__.py), with the loader's entry points.
__all__ = [
    "EVIDENCE", "RUNTIME_EXPORTS", "Catalog", "CatalogError", "Hook", "KvForward", "Location", "Manager",
    "ModelRunnerShape", "Site", "Trigger", "call_matches", "path_matches",
]

EMPTY_OK = {"empty": True}  # field metadata: the list may be given empty

# What the runtime module exports (docs/architecture.md, "The wiring contract").
RUNTIME_EXPORTS = ("attach_radix_cache", "canary_context", "context_tuple", "install_canary", "mark_init_finished")

# The arguments a site's wiring can carry: the hand-written `with_ops_outside_graph(...)` gives `outside`
# (and the forward batch), `with_active_single_forward_manager(...)` gives `active`.
EVIDENCE = ("outside", "active")


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
    """A location hint of a role: a file path suffix, class and method name patterns.

    Hints say where `scaffold` puts a placeholder in a tree that has none, and which files
    without the word `canary` are read at all; on a tree that holds placeholders or wiring,
    sites and hooks are found from what is there, whatever the hints say.
    """

    path: str
    classes: tuple[str, ...] = ("*",)
    methods: tuple[str, ...] = ("*",)
    manager: str | None = None
    # Lines of the method the site must guard: set by scaffold for a site on an uncovered forward path
    # (rewrite/transforms/cover.py), never read from a catalog file.
    lines: tuple[int, ...] = field(default=(), metadata={"internal": True})

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

    @property
    def owner(self) -> str:
        """What holds the manager: `self.model_runner` for `self.model_runner.canary_manager`, `self` for
        `self.canary_manager`. A class that uses its owner can reach the manager."""
        return self.expression.rpartition(".")[0] or self.expression


@dataclass(frozen=True)
class ModelRunnerShape:
    """How a model runner is recognised: by what its class calls, and by the names and types that hold one."""

    class_calls: tuple[str, ...] = ("_forward_raw",)
    names: tuple[str, ...] = ("*model_runner", "mr")
    types: tuple[str, ...] = field(default=("*ModelRunner",), metadata=EMPTY_OK)


@dataclass(frozen=True)
class Site:
    """A placeholder role, described by the shape of the code the placeholder guards."""

    role: str
    placeholder: str
    shape: Literal["wrap", "with_item", "argument"]  # wrap, with_item: it guards a with block; argument: it is passed to a call
    # What the guarded block (or the call receiving the placeholder) calls. Empty: a role scaffold places
    # only on an uncovered forward path, around the calls it goes on by; found by its placeholder's name.
    calls: tuple[str, ...] = field(metadata=EMPTY_OK)
    wiring: str  # expression; `{loop_index}` is the enclosing for-loop's variable
    manager: str  # a [managers.NAME] key
    candidates: tuple[Location, ...] = ()
    item: Literal["first", "last"] = "first"  # with_item: where the placeholder joins the with items
    loop: bool = False  # the site sits in a for loop whose variable the wiring uses
    requires: tuple[str, ...] = ()  # at least one of these must be called (default: one of `calls`)
    class_refs: tuple[str, ...] = ()  # the site's class must reference one of these dotted names
    evidence: tuple[Literal["outside", "active"], ...] = ()  # the arguments hand-written wiring of this role carries

    @property
    def required(self) -> tuple[str, ...]:
        return self.requires or self.calls


@dataclass(frozen=True)
class Hook:
    """A statement apply inserts where its shape says (after the KV pool, after graph capture ...) and revert removes.

    `statement` may name `{model_runner}` (the model runner as the enclosing code reaches it:
    `self`, a parameter, `self.tp_worker.model_runner`) and `{value}` (the attribute `place =
    "after_assign"` found assigned, e.g. `self.tree_cache`).
    """

    role: str
    statement: str
    place: Literal["after_assign", "after_capture"] = "after_assign"
    scope: Literal["model_runner", "holder", "manager"] = "model_runner"
    after_calls: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()
    manager: str | None = None  # scope = "manager": classes that reach this manager
    candidates: tuple[Location, ...] = ()


TRIGGER_KINDS = ("forward", "graph")


@dataclass(frozen=True)
class Trigger:
    """Calls that are forward paths: check flags those reachable outside every catalogued site.

    `kind` "forward": the call is itself a KV-reading forward. "graph": a graph capture or replay,
    flagged only when the captured or replayed code reaches a KV-reading forward.
    """

    calls: tuple[str, ...]
    what: str = "forward path"
    kind: Literal["forward", "graph"] = "forward"


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
    null_contexts: tuple[str, ...] = field(default=("nullcontext", "empty_context"), metadata=EMPTY_OK)
    model_runner: ModelRunnerShape = ModelRunnerShape()
    kv_forward: KvForward = KvForward()
    # Acknowledged findings (rewrite/suppressions.py): codes silenced everywhere, and (path pattern, codes)
    # silenced in the files whose path ends with the pattern (`per-file-ignores` in TOML).
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def placeholder_names(self) -> frozenset[str]:
        return frozenset(site.placeholder for site in self.sites)

    def with_locations(self, extra: dict[str, tuple[Location, ...]]) -> "Catalog":
        """The catalog with more location hints for some roles (role -> hints)."""
        sites = tuple(replace(s, candidates=s.candidates + tuple(extra.get(s.role, ()))) for s in self.sites)
        return replace(self, sites=sites)

    def locations(self):
        """Every (entry, location) pair: sites first, then hooks."""
        for entry in (*self.sites, *self.hooks):
            for location in entry.candidates:
                yield entry, location
