"""What locating finds in one file: sites and their state, generated members, problems, and the file's analysis.

Standard-library `ast` only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from canary_instrument.catalog import Catalog, Location, Manager, Site
from canary_instrument.rewrite.analysis.hooks import HookMatch
from canary_instrument.rewrite.handwritten import HandWired, parse_site
from canary_instrument.rewrite.syntax.blocks import loop_index
from canary_instrument.rewrite.syntax.imports import Imports
from canary_instrument.rewrite.syntax.nodes import dotted_name


MEMBER_MARKER = "# canary-instrument: generated; `canary-instrument revert` removes it"
CONTEXT_FUNCTION = "canary_context"


def value_kind(value: ast.AST, imports: Imports, catalog: Catalog) -> str:
    """`placeholder`, `wired` (`self.<member>(...)` or the runtime's `canary_context(...)`), `handwritten` or `other`."""
    if isinstance(value, ast.Call):
        name = dotted_name(value.func)
        if name is not None:
            if not value.args and not value.keywords and imports.resolve(name) == catalog.placeholder_factory:
                return "placeholder"
            if name == f"self.{catalog.member}":
                return "wired"
            if imports.resolve(name) == f"{catalog.runtime_module}.{CONTEXT_FUNCTION}":
                return "wired"
    if parse_site(value, imports.resolve, catalog.placeholder_factory, catalog.null_contexts) is not None:
        return "handwritten"
    return "other"


def _literal(node: ast.AST, loop_var: str | None) -> bool:
    if isinstance(node, ast.Name):
        return node.id == loop_var
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


@dataclass
class SiteMatch:
    """A placeholder site and its state: missing, placeholder, wired, handwritten, incomplete or other."""

    site: Site
    location: Location | None
    class_node: ast.ClassDef | None
    method: ast.FunctionDef | ast.AsyncFunctionDef
    block: list[ast.stmt]  # holds first..last (wrap: the statements wrapped; with_item: the with)
    first: ast.stmt
    last: ast.stmt
    manager: Manager
    member: str
    loop_index: str | None = None
    wrapper: ast.With | None = None  # the `with <placeholder>:` (wrap) or the with holding the item
    wrapper_block: list[ast.stmt] | None = None
    assign: ast.Assign | None = None
    state: str = "missing"
    handwired: HandWired | None = None
    usage: str = "with"  # "with" | "argument"
    placeholder: str = ""  # the assigned name (the role's placeholder for a missing site)
    batch: str | None = None  # the function's own name for the wiring's forward batch (`shapes.batch_variable`)

    @property
    def anchor(self) -> ast.stmt:
        """Where findings about this site point: the assignment, else the wrapper, else the first statement."""
        return self.assign or self.wrapper or self.first

    @property
    def where(self) -> str:
        return f"{self.class_node.name}.{self.method.name}" if self.class_node is not None else self.method.name

    @property
    def module_level(self) -> bool:
        return self.class_node is None

    def _template(self) -> ast.Call:
        return ast.parse(self.site.wiring.replace("{loop_index}", self.loop_index or ""), mode="eval").body

    def wiring(self) -> str:
        """The expression this site's placeholder becomes (or its wiring must conform to)."""
        text = self.site.wiring.replace("{loop_index}", self.loop_index or "")
        if self.handwired is None and not self.module_level and self.batch is None:
            return text
        call = self._template()
        forward_batch = ast.unparse(call.args[0]) if call.args else None
        if forward_batch is not None and self.batch is not None:
            forward_batch = self.batch
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        if self.handwired is not None:
            # Keep the hand-written expression where the catalog's is not a literal (the user's
            # `list(range(n_inner))`); literals (`[0]`, the loop index) are the catalog's.
            mine = {"outside": self.handwired.outside, "active": self.handwired.active}
            for key in keywords:
                given = mine.get(key)
                value = next(k.value for k in call.keywords if k.arg == key)
                if given is not None and not _literal(value, self.loop_index):
                    keywords[key] = given
            if forward_batch is not None and self.handwired.forward_batch and not _literal(call.args[0], None):
                forward_batch = self.handwired.forward_batch
        arguments = ([forward_batch] if forward_batch else []) + [f"{k}={v}" for k, v in keywords.items()]
        if not self.module_level:
            return f"self.{self.member}({', '.join(arguments)})"
        manager = self.manager
        expression = f"None if {manager.guard} else {manager.expression}" if manager.guard else manager.expression
        return f"{CONTEXT_FUNCTION}({', '.join([expression, *arguments])})"

    def conforms(self) -> bool:
        """A wired site holds what the catalog generates: the same arguments, literal ones equal."""
        value = self.assign.value
        expected = ast.parse(self.wiring(), mode="eval").body
        if not isinstance(value, ast.Call) or len(value.args) != len(expected.args):
            return False
        if ast.dump(value.func) != ast.dump(expected.func) and not self.module_level:
            return False
        if {k.arg for k in value.keywords} != {k.arg for k in expected.keywords}:
            return False
        pairs = list(zip(value.args, expected.args))
        given = {k.arg: k.value for k in value.keywords}
        pairs += [(given[k.arg], k.value) for k in expected.keywords]
        for index, (have, want) in enumerate(pairs):
            strict = _literal(want, self.loop_index) or (self.module_level and index == 0)
            if strict and ast.dump(have) != ast.dump(want):
                return False
        return True


@dataclass
class MemberInfo:
    class_node: ast.ClassDef
    manager: Manager
    node: ast.FunctionDef | None = None
    generated: bool = False


@dataclass
class Problem:
    """Canary code no site accounts for: `stray`, `duplicated`, `incomplete`, `unknown` or `ambiguous`."""

    node: ast.AST
    kind: str
    name: str
    detail: str = ""


@dataclass
class FileAnalysis:
    path: Path
    tree: ast.Module
    imports: Imports
    sites: list[SiteMatch] = field(default_factory=list)
    hooks: list[HookMatch] = field(default_factory=list)
    members: list[MemberInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    roles_expected: set[str] = field(default_factory=set)  # roles with a location hint at this path
    roles_reported: set[str] = field(default_factory=set)  # roles found but only as a problem (e.g. CI105)
    manager_conflicts: list[tuple[ast.ClassDef, str, str]] = field(default_factory=list)
    # Modules a model-runner class hands itself to for graph capture: they hold its after-capture hooks.
    handed: set[str] = field(default_factory=set)
    # Classes with sites that use nothing their manager expression reads (apply leaves their sites alone).
    unreachable: list[MemberInfo] = field(default_factory=list)
