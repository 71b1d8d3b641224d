"""Decide from a path and raw bytes alone what a file needs: site analysis, reach facts, or nothing.

This runs on every file of the tree, so it is one `bytes.find` per rare word, and a regex only on
the few files that hold one (each regex starts with a literal, so it cannot backtrack across a
long line).
"""

from __future__ import annotations

import fnmatch
import re

from canary_instrument.catalog import Catalog
from canary_instrument.rewrite.naming import receiver_fits

SITES = 1  # a catalog location or a placeholder: sites, hooks, members, strays
REACH = 2  # a trigger call: the file's functions join CI301's call graph

_STRAY = re.compile(rb"canary\w*_ctx")  # what locate's stray rule calls canary-named


def _literal_fragments(pattern: str) -> list[str]:
    return [f for f in re.split(r"[*?\[\]]", pattern) if f.strip(".")]


def trigger_regex(pattern: str) -> bytes:
    """A regex that every mention of a call matching catalog pattern `pattern` satisfies.

    Starts at the first literal character (a leading `*` needs no regex: search finds the rest),
    dots may have spaces around them, and no `(` is required so that an alias
    (`fwd = self.model_runner.model.forward`) counts as a mention too.
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
        # Placeholder names not caught by the canary-named pattern (a catalog may name its own).
        self._placeholders = sorted(
            name.encode() for name in catalog.placeholder_names | {catalog.member} if not _STRAY.fullmatch(name.encode())
        )
        # Per trigger pattern: its longest literal (a cheap test), then the exact regex.
        by_word: dict[bytes, list[bytes]] = {}
        for trigger in catalog.triggers:
            for pattern in trigger.calls:
                word = max(_literal_fragments(pattern), key=len, default="").strip(".")
                by_word.setdefault(word.encode(), []).append(trigger_regex(pattern))
        self._triggers = [(word, re.compile(b"|".join(regexes))) for word, regexes in sorted(by_word.items())]

    def path_matches(self, posix: str) -> bool:
        return self._path is not None and self._path.match(posix) is not None

    def needs(self, posix: str, data: bytes) -> int:
        """SITES | REACH bits for a file (0: nothing to analyse)."""
        flags = 0
        if self.path_matches(posix):
            flags = SITES | REACH
        elif (b"canary" in data and _STRAY.search(data) is not None) or any(p in data for p in self._placeholders):
            flags = SITES | REACH
        elif self.has_trigger(data):
            flags = REACH
        return flags

    def has_trigger(self, data: bytes) -> bool:
        return any(word in data and regex.search(data) is not None for word, regex in self._triggers)


# -- callers: which other files may call a function on an uncovered path ----------------------------

class CallerSearch:
    """Finds, in raw bytes, the files that may call one of a set of functions: by its name, on a receiver
    whose name fits the function's class (or as a plain name for a function or a constructor), or that
    subclass one of those classes (a subclass inherits the calls on `self`)."""

    def __init__(self, wanted) -> None:
        """`wanted`: ("call", name, class or None) and ("subclass", class) entries (`uncovered.callers_wanted`)."""
        calls: dict[bytes, set[str | None]] = {}
        bases: set[str] = set()
        for entry in wanted:
            if entry[0] == "call":
                calls.setdefault(entry[1].encode(), set()).add(entry[2])
            else:
                bases.add(entry[1])
        # Each regex starts with the literal name, so a search skips to it; the receiver is read backwards.
        self._calls = [
            (word, owners, re.compile(rb"(?<!\w)" + re.escape(word) + rb"(?!\w)"))
            for word, owners in sorted(calls.items(), key=lambda item: item[0])
        ]
        self._bases = [
            (name.encode(), re.compile(rb"\bclass\s+\w+\s*\([^)]*(?<![\w])" + re.escape(name.encode()) + rb"(?!\w)"))
            for name in sorted(bases)
        ]

    def matches(self, data: bytes) -> bool:
        for word, regex in self._bases:
            if word in data and regex.search(data) is not None:
                return True
        for word, owners, regex in self._calls:
            if word not in data:
                continue
            for match in regex.finditer(data):
                receiver = _receiver_before(data, match.start())
                if receiver is None:
                    if None in owners:  # a plain function or a constructor, called or passed by name
                        return True
                    continue
                if receiver in ("self", "cls", "super"):
                    continue  # within a class: its own file, or a subclass's (found by its bases)
                if any(c is not None and receiver_fits(receiver, c) for c in owners):
                    return True
                if None in owners and receiver[:1].islower():
                    return True  # `module.function(...)`
        return False


_IDENTIFIER_END = re.compile(rb"\w+\Z")


def _receiver_before(data: bytes, start: int) -> str | None:
    """The receiver's name in `<receiver>.name` ending at `start` (`x.runners[i].name` -> runners,
    `get_runner().name` -> get_runner); None when the name is not an attribute."""
    window = data[max(0, start - 160) : start].rstrip()
    if not window.endswith(b"."):
        return None
    window = window[:-1].rstrip()
    for opener, closer in ((b"[", b"]"), (b"(", b")")):
        if window.endswith(closer):
            depth = 0
            for index in range(len(window) - 1, -1, -1):
                char = window[index : index + 1]
                if char == closer:
                    depth += 1
                elif char == opener:
                    depth -= 1
                    if depth == 0:
                        window = window[:index].rstrip()
                        break
            else:
                return None
            break
    match = _IDENTIFIER_END.search(window)
    return match.group().decode("ascii", "replace") if match is not None else None
