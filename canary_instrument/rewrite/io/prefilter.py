"""Decide from a path and raw bytes alone what a file needs: site analysis, reach facts, or nothing.

This runs on every file of the tree, so it is one `bytes.find` per rare word, and a regex only on
the few files that hold one (each regex starts with a literal, so it cannot backtrack across a
long line).
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


def _required_literal(pattern: str) -> str | None:
    """The longest run of literal characters that every path matching the shell-style `pattern` holds
    (None where the pattern has a bracket set, whose characters are not literal)."""
    if "[" in pattern:
        return None
    return max(re.split(r"[*?]", pattern), key=len) or None


def _name_regex(patterns: list[str]) -> str:
    """An alternation matching identifiers that match any of the shell-style name `patterns`."""
    return "|".join(
        "".join(r"\w*" if ch == "*" else r"\w" if ch == "?" else re.escape(ch) for ch in pattern) for pattern in patterns
    ) or "(?!)"


def _merge_literals(literals: set[str]) -> set[str]:
    """Fewer literals for the byte scan: two that share a substring as specific as an identifier
    part (6+ characters with `_` or `.`, e.g. `_runner`) become that substring."""
    words = set(literals)
    merged = True
    while merged:
        merged = False
        ordered = sorted(words)
        for index, first in enumerate(ordered):
            for second in ordered[index + 1 :]:
                common = _longest_common_substring(first, second)
                if len(common) >= 6 and ("_" in common or "." in common):
                    words -= {first, second}
                    words.add(common)
                    merged = True
                    break
            if merged:
                break
    return words


def _longest_common_substring(first: str, second: str) -> str:
    best = ""
    for start in range(len(first)):
        for end in range(start + len(best) + 1, len(first) + 1):
            if first[start:end] in second:
                best = first[start:end]
            else:
                break
    return best


def trigger_regex(pattern: str) -> bytes:
    """A regex that every mention of a call matching catalog pattern `pattern` satisfies.

    Starts at the first literal character (a leading `*` needs no regex: search finds the rest) and
    lets dots have spaces around them; `code_use` then tells a call (or a callable passed on or
    aliased) from a mention in a comment or a docstring.
    """
    body = pattern.lstrip("*")
    out = []
    for component in body.split("."):
        out.append("".join(r"\w*" if ch == "*" else r"\w" if ch == "?" else re.escape(ch) for ch in component))
    regex = r"\s*\.\s*".join(out)
    if not pattern.startswith("*"):
        regex = r"(?<![\w])" + regex
    return (regex + r"(?!\w)").encode()


class Prefilter:
    """What a file needs, from its path and bytes."""

    def __init__(self, catalog: Catalog) -> None:
        patterns = {location.path for _, location in catalog.locations()}
        regexes = []
        for pattern in sorted(patterns):
            regexes.append(fnmatch.translate(pattern))
            regexes.append(fnmatch.translate("*/" + pattern))
        self._path = re.compile("|".join(regexes)) if regexes else None
        # A path can match a pattern only where it holds the pattern's longest literal run: most paths
        # of a tree hold none, and an `in` test costs far less than the regex (None: no such run).
        self._path_words = [_required_literal(pattern) for pattern in sorted(patterns)]
        self._located: dict[str, bool] = {}
        # An object built with the draft flag (`is_draft_worker=True`): its model runner's forward is a
        # draft forward under any attribute name (reach: `respell`), so the file joins the call graph.
        flag = next(iter(sorted(m.guard.rpartition(".")[2] for m in catalog.managers.values() if m.guard)), None)
        self._draft_flag = (
            [flag.encode()], re.compile(rb"(?<!\w)" + re.escape(flag.encode()) + rb"\s*=\s*True\b")
        ) if flag else None
        # Placeholder names not caught by the canary-named pattern (a catalog may name its own).
        self._placeholders = sorted(
            name.encode() for name in catalog.placeholder_names | {catalog.member} if not _STRAY.fullmatch(name.encode())
        )
        # Per trigger pattern its longest literal, a cheap test before the exact regex; literals that
        # share an identifier part (`graph_runner`, `draft_runner.forward` -> `_runner`) merge into
        # it, since one pass over every file per literal is what this costs.
        regexes_by_literal: dict[str, list[bytes]] = {}
        for trigger in catalog.triggers:
            for pattern in trigger.calls:
                literal = max(_literal_fragments(pattern), key=len, default="").strip(".")
                regexes_by_literal.setdefault(literal, []).append(trigger_regex(pattern))
        merged = _merge_literals(set(regexes_by_literal))
        self._triggers = [
            (word.encode(), re.compile(b"|".join(r for literal in sorted(regexes_by_literal) if word in literal
                                                 for r in regexes_by_literal[literal])))
            for word in sorted(merged)
        ]
        # Where every pattern behind a word's regex starts with a literal, a match can only start where
        # one of those literals stands: `bytes.find` them and try the regex there, instead of letting
        # it test every position of the file (which, for `_runner`, is most of the prefilter's time).
        leads: dict[str, set[bytes] | None] = {}
        for trigger in catalog.triggers:
            for pattern in trigger.calls:
                literal = max(_literal_fragments(pattern), key=len, default="").strip(".")
                for word in merged:
                    if word in literal:
                        lead = _leading_literal(pattern)
                        known = leads.setdefault(word, set())
                        leads[word] = None if lead is None or known is None else known | {lead}
        self._leads = [sorted(leads.get(word.decode()) or ()) or None for word, _ in self._triggers]
        # A catalog location holds a site or hook only in a class its candidates name (or, where
        # upstream moved graph set-up out of its class, a module-level function named like a method).
        self._classes: list[tuple[re.Pattern, re.Pattern]] = []
        for path_pattern in sorted(patterns):
            locations = [loc for _, loc in catalog.locations() if loc.path == path_pattern]
            classes = _name_regex(sorted({c for loc in locations for c in loc.classes}))
            methods = _name_regex(sorted({m for loc in locations for m in loc.methods}))
            self._classes.append((
                re.compile(f"(?:{fnmatch.translate(path_pattern)})|(?:{fnmatch.translate('*/' + path_pattern)})"),
                re.compile(rf"^(?:[ \t]*class[ \t]+(?:{classes})|(?:async[ \t]+)?def[ \t]+(?:{methods}))\b".encode(),
                           re.MULTILINE),
            ))

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
        """Whether a file is at a catalog location (asked twice per file: weighed, then examined)."""
        found = self._located.get(posix)
        if found is None:
            found = self._located[posix] = self._path is not None and any(
                word is None or word in posix for word in self._path_words
            ) and self._path.match(posix) is not None
        return found

    def needs(self, posix: str, data: bytes) -> int:
        """SITES | REACH | ROLES bits for a file (0: nothing to analyse). A file at a catalog
        location gets site analysis only when it holds a candidate class or a canary word: anything
        else there can hold no site, hook or placeholder, only the roles CI102 expects at its path."""
        located = self.path_matches(posix)
        flags = ROLES if located else 0
        if b"noqa" in data and _NOQA.search(data) is not None:
            flags |= NOQA
        if b"canary" in data or any(p in data for p in self._placeholders):
            if located or _STRAY.search(data) is not None or any(p in data for p in self._placeholders):
                return flags | SITES | REACH
        if located and self.holds_candidate_class(posix, data):
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

    def holds_candidate_class(self, posix: str, data: bytes) -> bool:
        """A candidate class statement, or a module-level function named like a candidate method."""
        return any(path.match(posix) and classes.search(data) for path, classes in self._classes)

    def builds_draft(self, data: bytes) -> bool:
        """The file builds an object with the draft flag and calls a forward on an attribute of `self`."""
        # Tried only where the flag's name stands: a regex searched from every position of every file
        # costs more than the rest of the prefilter.
        if self._draft_flag is None:
            return False
        (word,), regex = self._draft_flag
        return (word in data and next(_matches_at(regex, data, [word]), None) is not None
                and _SELF_FORWARD.search(data) is not None)

    def has_trigger(self, data: bytes) -> bool:
        for (word, regex), leads in zip(self._triggers, self._leads):
            if word in data:
                matches = regex.finditer(data) if leads is None else _matches_at(regex, data, leads, word)
                for match in matches:
                    if code_use(data, match.start(), match.end()):
                        return True
        return False


_SELF_FORWARD = re.compile(rb"self\.\w+\.forward\w*\(")


def _builds_attribute(data: bytes, name: bytes, assign: re.Pattern, local: re.Pattern) -> bool:
    """An assignment `self.NAME = VALUE` that may build NAME here: VALUE is not just a parameter of that name."""
    for match in assign.finditer(data):
        value = match.group(1).rstrip()
        if value != name or local.search(data) is not None:
            return True
    return False


def _leading_literal(pattern: str) -> bytes | None:
    """The literal a match of `trigger_regex(pattern)` starts with (`graph_runner` for
    `*graph_runner*.replay`), or None when it starts with a wildcard."""
    body = pattern.lstrip("*")
    end = next((i for i, ch in enumerate(body) if ch in "*?[."), len(body))
    return body[:end].encode() or None


def _matches_at(regex: re.Pattern, data: bytes, leads: list[bytes], anchor: bytes = b""):
    """`regex.finditer(data)` for a regex each of whose matches starts with one of `leads`: the same
    matches, tried only where a lead stands. The leads that hold `anchor` are found from the hits of
    one pass for it (a lead stands where the anchor stands at its offset in the lead): each pass over
    a file costs the same whatever it looks for."""
    starts = []
    anchored = [(lead, lead.find(anchor)) for lead in leads if anchor and anchor in lead]
    if anchored:
        at = data.find(anchor)
        while at >= 0:
            for lead, offset in anchored:
                if at >= offset and data.startswith(lead, at - offset):
                    starts.append(at - offset)
            at = data.find(anchor, at + 1)
    for lead in leads:
        if not anchored or anchor not in lead:
            at = data.find(lead)
            while at >= 0:
                starts.append(at)
                at = data.find(lead, at + 1)
    starts.sort()
    end = 0
    for at in starts:
        if at >= end and (match := regex.match(data, at)) is not None:
            yield match
            end = max(match.end(), at + 1)


def line_start(data: bytes, position: int) -> int:
    """Start of the line holding `position` (files searched as one buffer are joined by NUL)."""
    newline = data.rfind(b"\n", 0, position)
    return max(newline, data.rfind(b"\0", newline + 1, position)) + 1


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
