"""Decide from a path and raw bytes alone what a file needs: site analysis, reach facts, or nothing.

This runs on every file of the tree, so it is a `word in data` test per rare word, and a regex only
on the few files that hold one. Parsing every file instead costs several times ast-grep's whole run
(bench/check/RESULTS.md).
"""

from __future__ import annotations

import fnmatch
import re

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.syntax.nodes import CANARY_CONTEXT_PATTERN

SITES = 1  # a candidate class at a catalog location, or a placeholder: sites, hooks, members, strays
REACH = 2  # a trigger call: the file's functions join CI301's call graph
ROLES = 4  # a catalog location: the roles expected there (CI102), even with nothing else to analyse
NOQA = 8  # a `# noqa` directive naming a code of ours: read for its suppressions (CI401)

_NOQA = re.compile(rb"#[ \t]*noqa[ \t]*:[^\n]*?\bci[0-9]{3}", re.IGNORECASE)

_STRAY = re.compile(CANARY_CONTEXT_PATTERN.encode())  # what locate's stray rule calls canary-named


def _literal_fragments(pattern: str) -> list[str]:
    return [f for f in re.split(r"[*?\[\]]", pattern) if f.strip(".")]


def _name_regex(patterns: list[str]) -> str:
    """An alternation matching identifiers that match any of the shell-style name `patterns`."""
    return "|".join(
        "".join(r"\w*" if ch == "*" else r"\w" if ch == "?" else re.escape(ch) for ch in pattern) for pattern in patterns
    ) or "(?!)"


def _path_regex(patterns) -> re.Pattern:
    """Paths that match one of the shell-style `patterns`, in any folder."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})|(?:{fnmatch.translate('*/' + p)})" for p in patterns))


def trigger_regex(pattern: str) -> bytes:
    """A regex that every mention of a call matching catalog pattern `pattern` satisfies, dots with spaces
    around them allowed; `code_use` then tells a call (or a callable passed on or aliased) from a mention
    in a comment or a docstring."""
    body = pattern.lstrip("*")
    regex = r"\s*\.\s*".join(
        "".join(r"\w*" if ch == "*" else r"\w" if ch == "?" else re.escape(ch) for ch in component)
        for component in body.split(".")
    )
    if not pattern.startswith("*"):
        regex = _not_after_word(regex, re.match(r"[^*?\[.]*", body).group())
    return (regex + r"(?!\w)").encode()


def _not_after_word(regex: str, lead: str) -> str:
    """`regex`, which starts with the literal `lead`, matched only where no identifier character stands
    before it. The look-behind goes after the literal (the same matches as before it): a regex that
    starts with a literal is searched for by that literal, far faster than one tried at every position."""
    escaped = re.escape(lead)
    return escaped + rf"(?<!\w{escaped})" + regex[len(escaped):] if lead else r"(?<!\w)" + regex


class Prefilter:
    """What a file needs, from its path and bytes: a word test first, a regex only where the word stands."""

    def __init__(self, catalog: Catalog) -> None:
        patterns = sorted({location.path for _, location in catalog.locations()})
        self._path = _path_regex(patterns) if patterns else None
        # Placeholder names not caught by the canary-named pattern (a catalog may name its own).
        self._placeholders = sorted(
            name.encode() for name in catalog.placeholder_names | {catalog.member} if not _STRAY.fullmatch(name.encode())
        )
        # A catalog location holds a site or hook only in a class its candidates name (or, where
        # upstream moved graph set-up out of its class, a module-level function named like a method).
        self._classes = []
        for pattern in patterns:
            locations = [loc for _, loc in catalog.locations() if loc.path == pattern]
            classes = _name_regex(sorted({c for loc in locations for c in loc.classes}))
            methods = _name_regex(sorted({m for loc in locations for m in loc.methods}))
            self._classes.append((_path_regex([pattern]), re.compile(
                rf"^(?:[ \t]*class[ \t]+(?:{classes})|(?:async[ \t]+)?def[ \t]+(?:{methods}))\b".encode(), re.MULTILINE)))
        # Each trigger pattern with the longest word every match holds: the regex runs only on files holding it.
        self._triggers = [
            (max(re.split(r"[*?\[\].]", pattern), key=len).encode(), re.compile(trigger_regex(pattern)))
            for trigger in catalog.triggers for pattern in trigger.calls
        ]
        # An object built with the draft flag (`is_draft_worker=True`): its model runner's forward is a
        # draft forward under any attribute name (reach: `respell`), so the file joins the call graph.
        flag = next(iter(sorted(m.guard.rpartition(".")[2] for m in catalog.managers.values() if m.guard)), None)
        self._draft_flag = (flag.encode(), re.compile(_not_after_word(re.escape(flag) + r"\s*=\s*True\b", flag).encode())) \
            if flag else None
        # A hook held by a class that holds a model runner (the scheduler's attach-cache) is not reached by
        # following the model runner: a file may hold its place wherever it assigns the attribute the hook
        # follows and names a model runner.
        # `self.NAME = NAME` hands over a parameter (no place) unless the file also assigns a local NAME.
        self._holder_assigns = [
            (
                name.encode(),
                re.compile(rb"self\s*\.\s*" + re.escape(name.encode()) + rb"\s*(?::[^=\n]*)?=(?!=)[ \t]*(.*)"),
                re.compile(rb"^[ \t]*" + re.escape(name.encode()) + rb"\s*(?::[^=\n]*)?=(?!=)", re.MULTILINE),
            )
            for hook in catalog.hooks if hook.scope == "holder" for name in hook.assigns
        ]
        self._runner_words = sorted({
            fragment.encode() for pattern in catalog.model_runner.names for fragment in _literal_fragments(pattern)
            if len(fragment) > 3
        })

    def path_matches(self, posix: str) -> bool:
        """Whether a file is at a catalog location."""
        return self._path is not None and self._path.match(posix) is not None

    def needs(self, posix: str, data: bytes) -> int:
        """SITES | REACH | ROLES bits for a file (0: nothing to analyse). A file at a catalog
        location gets site analysis only when it holds a candidate class or a canary word: anything
        else there can hold no site, hook or placeholder, only the roles CI102 expects at its path."""
        located = self.path_matches(posix)
        flags = ROLES if located else 0
        if b"noqa" in data and _NOQA.search(data) is not None:
            flags |= NOQA
        placeholder = any(p in data for p in self._placeholders)
        if (b"canary" in data or placeholder) and (located or placeholder or _STRAY.search(data) is not None):
            return flags | SITES | REACH
        if located and any(path.match(posix) and classes.search(data) for path, classes in self._classes):
            return flags | SITES | REACH
        reach = REACH if self.has_trigger(data) or self.builds_draft(data) else 0
        if self.holds_holder_place(data):
            return flags | SITES | reach
        return flags | reach

    def holds_holder_place(self, data: bytes) -> bool:
        """An assignment of the attribute a holder-scoped hook follows, in a file that names a model runner."""
        return any(
            name in data and _builds_attribute(data, name, assign, local) for name, assign, local in self._holder_assigns
        ) and any(word in data for word in self._runner_words)

    def builds_draft(self, data: bytes) -> bool:
        """The file builds an object with the draft flag and calls a forward on an attribute of `self`."""
        if self._draft_flag is None:
            return False
        word, regex = self._draft_flag
        return word in data and regex.search(data) is not None and _SELF_FORWARD.search(data) is not None

    def has_trigger(self, data: bytes) -> bool:
        return any(
            word in data and any(code_use(data, match.start(), match.end()) for match in regex.finditer(data))
            for word, regex in self._triggers
        )


_SELF_FORWARD = re.compile(rb"self\.\w+\.forward\w*\(")


def _builds_attribute(data: bytes, name: bytes, assign: re.Pattern, local: re.Pattern) -> bool:
    """An assignment `self.NAME = VALUE` that may build NAME here: VALUE is not just a parameter of that name."""
    for match in assign.finditer(data):
        value = match.group(1).rstrip()
        if value != name or local.search(data) is not None:
            return True
    return False


def line_start(data: bytes, position: int) -> int:
    """Start of the line holding `position`."""
    return data.rfind(b"\n", 0, position) + 1


def code_use(data: bytes, start: int, end: int) -> bool:
    """Whether the name at data[start:end] is called (`name(`), or passed on or aliased as a value
    (`f(x, name)`, `fwd = name`), rather than mentioned in a comment or a docstring's prose."""
    if data[line_start(data, start) : start].lstrip()[:1] == b"#":
        return False
    after = data[end : end + 80].lstrip()[:1]
    if after == b"(":
        return True
    if after not in (b",", b")", b"\n", b"\r", b"", b"#"):
        return False
    before = start
    while before > 0 and (data[before - 1 : before].isalnum() or data[before - 1 : before] in (b"_", b".")):
        before -= 1
    return data[max(0, before - 80) : before].rstrip()[-1:] in (b"(", b",", b"=", b"[")
