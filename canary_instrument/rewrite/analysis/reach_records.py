"""The plain records one file's reach facts are made of, and what they are keyed by.

They cross between check's processes and into its cache, so each pickles as a call of its class.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


MODULE = "<module>"  # the pseudo-function holding a file's top-level (and class-body) code

# Call targets, as plain tuples resolved in the tree pass:
#   ("self", m)              self.m(...): the method of the enclosing class, its bases and overrides
#   ("super", m)             super().m(...)
#   ("attr", a, m, on_self)  <x>.a.m(...): a method m of the classes attribute `a` is known to hold
#   ("var", v, m)            v.m(...) for a local or parameter v of unknown class
#   ("typed", types, m)      v.m(...) for a local or parameter annotated or constructed with `types`
#   ("global", q)            a qualified name (an import, or a function or class of this file)
#   ("def", qualname)        a function nested in the enclosing one, by its qualified name
#   ("ret", t, m, word)      f(...).m(...): m on what the call of target t returns (its return annotation,
#                            or the class it constructs)
#   ("name", m, word)        .m(...) on anything else (`self.runners[i].m`); `word` names the receiver
#                            (`runners`) or is None
# What a receiver holds comes from what the code shows (type sources, below): annotations,
# constructor calls, what a called function returns, an attribute of a typed object. A receiver's name
# only ranks a base class's overrides (naming.receiver_fits); one nothing types reaches nothing.
#
# Type sources (what a local, an attribute or a function's result holds):
#   ("q", qualified)         an instance of the class so named (annotation, constructor call)
#   ("attr", a)              what `self.a` holds, in the class of the function asking
#   ("call", t, scope)       what the call of target t returns, t resolved from function `scope`
#   ("get", sources, a)      attribute `a` of what `sources` hold (`capture.decode.runner`)


# Where in a call target of each kind the method it names stands (none for a qualified name or a
# nested function).
METHOD_AT = {"self": 1, "super": 1, "name": 1, "attr": 2, "var": 2, "typed": 2, "ret": 2}


def target_method(target: tuple) -> str | None:
    """The method a call target names, None for a qualified name or a nested function."""
    position = METHOD_AT.get(target[0])
    return target[position] if position is not None else None


def _pickled_as_call(cls):
    """Pickle a record as a call of its class with its fields: a file's facts cross a pipe between
    check's two processes, and the default (through copyreg and `__getnewargs__`) is slower for the
    many edges a file holds."""
    cls.__reduce__ = lambda self: (cls, tuple(self))
    return cls


@_pickled_as_call
class Edge(NamedTuple):
    """A call, or a reference to a function that is passed on or stored, inside one function."""

    target: tuple
    line: int
    site: str | None  # role of the catalogued site whose statements hold it
    call: bool = True  # False: a function read without a call (a reference to a class is no edge)


@_pickled_as_call
class TriggerCall(NamedTuple):
    name: str  # dotted name as written (an alias resolved: `fwd = self.model_runner.model.forward`)
    kind: str  # "forward" | "graph"
    what: str
    line: int
    col: int  # 1-based, in characters
    site: str | None
    target: tuple | None  # what the call runs (a graph trigger: the capture or replay method)
    passed: tuple[tuple, ...]  # callables given as arguments (what a capture captures)


@_pickled_as_call
class DefFacts(NamedTuple):
    qualname: str  # `EagerRunner.execute`, `Runner.capture.<locals>.run_once`, or MODULE
    cls: str | None  # qualified name of the class it is a method of
    line: int
    edges: tuple[Edge, ...]
    triggers: tuple[TriggerCall, ...]
    kv: bool  # makes a KV-reading forward call by shape (catalog `kv_forward`)
    returns: tuple[tuple, ...] = ()  # what it returns: its annotation's classes, or `return self.a[...]`/`Foo(...)`
    returned: tuple[tuple, ...] = ()  # what its first `return` hands back, as type sources (preferred when they resolve)


@_pickled_as_call
class ClassRecord(NamedTuple):
    qualname: str
    line: int
    bases: tuple[str, ...]  # qualified names
    attrs: tuple[tuple[str, tuple], ...]  # attribute -> qualified class names it holds, or type sources


@_pickled_as_call
class ReachFacts(NamedTuple):
    """What the tree pass needs to know about one file."""

    module: str  # dotted path of the file (folders and stem), what its own qualified names start with
    classes: tuple[ClassRecord, ...] = ()
    defs: tuple[DefFacts, ...] = ()
    names: tuple[tuple[str, tuple[str, ...]], ...] = ()  # parameter/field name -> annotated classes


def module_name(path: Path) -> str:
    parts = list(Path(path).with_suffix("").parts)
    parts = [p for p in parts if p not in ("/", "", ".", "..") and not p.endswith(":\\")]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def site_spans(analysis) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(role, start, end) of each located site's statements: a wrap site's first..last, a with-item
    site's `with`. Calls inside run under the site's canary context (once it is wired)."""
    spans = []
    for match in analysis.sites:
        first, last = match.first, match.last
        if match.wrapper is not None and getattr(match.wrapper, "end_lineno", None) is not None:
            first = last = match.wrapper
        spans.append((
            match.site.role,
            (first.lineno, first.col_offset),
            (last.end_lineno or last.lineno, last.end_col_offset or 0),
        ))
    return spans
