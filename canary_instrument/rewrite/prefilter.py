"""Decide from a path and raw bytes alone whether a file needs parsing (what keeps `check` fast)."""

from __future__ import annotations

import fnmatch
import re

from canary_instrument.catalog import Catalog


def prefilter_words(catalog: Catalog) -> list[bytes]:
    """Byte strings at least one of which a file must contain to need analysis beyond its path.

    One `bytes.find` pass per word dominates `check` on a large tree, so words that share a
    long substring (`graph_runner`, `draft_runner.forward` -> `_runner`) are merged into it.
    """
    words = {"canary"}  # covers every canary-named placeholder and the runtime imports
    words |= {name for name in catalog.placeholder_names if "canary" not in name}
    for trigger in catalog.triggers:
        for pattern in trigger.calls:
            fragments = [f.strip(".") for f in re.split(r"[*?\[\]]", pattern)]
            words.add(max(fragments, key=len))
    merged = True
    while merged:
        merged = False
        ordered = sorted(words)
        for index, first in enumerate(ordered):
            for second in ordered[index + 1 :]:
                common = _longest_common_substring(first, second)
                # Only a substring as specific as an identifier part (`_runner`), not `forward`.
                if len(common) >= 6 and ("_" in common or "." in common):
                    words -= {first, second}
                    words.add(common)
                    merged = True
                    break
            if merged:
                break
    return sorted(w.encode() for w in words)


def _longest_common_substring(first: str, second: str) -> str:
    best = ""
    for start in range(len(first)):
        for end in range(start + len(best) + 1, len(first) + 1):
            if first[start:end] in second:
                best = first[start:end]
            else:
                break
    return best


def call_regex(pattern: str) -> bytes:
    """A regex over source bytes that every call matching the catalog call `pattern` satisfies."""
    parts = []
    for component in pattern.split("."):
        parts.append("".join(r"\w*" if ch == "*" else r"\w" if ch == "?" else re.escape(ch) for ch in component))
    body = r"\s*\.\s*".join(parts)
    return (rb"(?<![\w])" if not pattern.startswith("*") else b"") + body.encode() + rb"\s*\("


class Prefilter:
    """Decides from a path and raw bytes alone whether a file needs parsing."""

    def __init__(self, catalog: Catalog) -> None:
        patterns = {location.path for _, location in catalog.locations()}
        regexes = []
        for pattern in sorted(patterns):
            regexes.append(fnmatch.translate(pattern))
            regexes.append(fnmatch.translate("*/" + pattern))
        self._path = re.compile("|".join(regexes)) if regexes else None
        self._words = prefilter_words(catalog)
        calls = sorted({p for trigger in catalog.triggers for p in trigger.calls})
        self._calls = re.compile(b"|".join(call_regex(p) for p in calls)) if calls else None

    def path_matches(self, posix: str) -> bool:
        return self._path is not None and self._path.match(posix) is not None

    def bytes_match(self, data: bytes) -> bool:
        """A canary word, or a trigger call (a cheap word test first, the exact regex only then)."""
        if b"canary" in data:
            return True
        if self._calls is None or not any(word in data for word in self._words):
            return False
        return self._calls.search(data) is not None
