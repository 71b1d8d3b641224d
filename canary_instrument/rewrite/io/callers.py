"""Which other files may call a function on an uncovered path (CI301's caller search), from their raw bytes.

Split from ``prefilter`` (the byte-level gate of which files a rule must parse); both read bytes, never a
syntax tree, and share ``prefilter.code_use``.
"""

from __future__ import annotations

import re

from canary_instrument.rewrite.io.prefilter import code_use, line_start
from canary_instrument.rewrite.syntax.naming import receiver_fits


class CallerSearch:
    """Finds, in the raw bytes of many files, those that may call one of a set of functions: by its name
    on a receiver whose name fits the function's class, as a plain name for a function or a
    constructor, or that subclass one of those classes (a subclass inherits the calls on `self`).

    Each needle (a name, or a part several class names share) is looked for with one `bytes.find` pass
    over every file (the cost that matters on a tree of thousands of files); each hit is then judged
    where it stands. The files are searched one by one, not joined into one buffer: the copy of a
    tree's bytes into fresh memory costs a good part of a search.
    """

    def __init__(self, datas: list[bytes]) -> None:
        self._datas = datas

    def find(self, wanted) -> set[int]:
        """Indexes of the files that hold a use `wanted` names: ("call", name, class or None),
        ("subclass", class) and ("define", class) entries (`uncovered.callers_wanted`)."""
        owners: dict[str, set[str | None]] = {}
        bases: set[str] = set()
        defined: set[str] = set()
        for entry in wanted:
            if entry[0] == "call":
                owners.setdefault(entry[1], set()).add(entry[2])
            elif entry[0] == "subclass":
                bases.add(entry[1])
            elif entry[0] == "define":
                defined.add(entry[1])
        words = sorted(owners.keys() | bases | defined)

        # One pass over the whole tree per needle: a word, or a part that several class names share (`_needles`).
        found: set[int] = set()
        for needle, group in _needles(words):
            found |= self._files_using(needle, group, owners, bases, defined)
        return found

    def _files_using(self, needle: str, words: list[str], owners: dict, bases: set[str], defined: set[str]) -> set[int]:
        """The files where one of `words` (each holding `needle`) stands as a use to judge."""
        raw = needle.encode()
        # Where each word holds the needle: a hit of the needle at p may be the word at p - offset.
        spans = [(word.encode(), offset, owners.get(word, ()), word in bases, word in defined)
                 for word in words for offset in _offsets(word, needle)]
        found: set[int] = set()
        for index, data in enumerate(self._datas):
            position = data.find(raw)
            while position >= 0:
                if _counts(data, position, spans):
                    found.add(index)
                    break  # one use is enough
                position = data.find(raw, position + 1)
        return found


def _counts(data: bytes, position: int, spans) -> bool:
    """Whether the needle's hit at `position` is one of the words (`spans`, `_files_using`) standing where a
    use counts: in a class's bases, as a class's name, or as a call of a function wanted."""
    for word, offset, classes, base, define in spans:
        start = position - offset
        if start < 0 or not data.startswith(word, start):
            continue
        end = start + len(word)
        if not _identifier_byte(data, start - 1) and not _identifier_byte(data, end) and (
            (base and _in_class_bases(data, start))
            or (define and _defines_class(data, start))
            or (classes and _a_call_of(data, start, end, classes))
        ):
            return True
    return False


# A part of a class name shared by several wanted names is searched for once for all of them: class
# names are CamelCase words, and a part such as `Runner` stands rarely enough in code that judging each
# of its hits costs less than a pass over the tree per name. Lower-case names (methods) are searched
# for apart: a shared part such as `forward_` stands too often.
_SHARED_PART = 6


def _needles(words: list[str]) -> list[tuple[str, list[str]]]:
    """(needle, the words holding it) to search for, every word in exactly one group."""
    groups: list[tuple[str, list[str]]] = [(word, [word]) for word in words]
    merged = True
    while merged:
        merged = False
        for i, (first, members) in enumerate(groups):
            for j in range(i + 1, len(groups)):
                second, others = groups[j]
                common = _shared_part(first, second)
                if common is not None:
                    groups[i] = (common, members + others)
                    del groups[j]
                    merged = True
                    break
            if merged:
                break
    return groups


def _shared_part(first: str, second: str) -> str | None:
    """The longest CamelCase part (an upper-case letter, then at least `_SHARED_PART` characters in all)
    that both names hold, or None."""
    best = None
    for start, char in enumerate(first):
        if not char.isupper():
            continue
        end = start + _SHARED_PART
        while end <= len(first) and first[start:end] in second:
            if best is None or end - start > len(best):
                best = first[start:end]
            end += 1
    return best


def _offsets(word: str, needle: str) -> list[int]:
    """Every position of `needle` in `word`."""
    out = []
    at = word.find(needle)
    while at >= 0:
        out.append(at)
        at = word.find(needle, at + 1)
    return out


def _identifier_byte(data: bytes, index: int) -> bool:
    if index < 0 or index >= len(data):
        return False
    byte = data[index]
    return byte == 95 or 48 <= byte <= 57 or 65 <= byte <= 90 or 97 <= byte <= 122 or byte >= 128


def _in_class_bases(data: bytes, position: int) -> bool:
    """Whether data[position:] stands in the bases of a class statement (`class X(Base, ...)`)."""
    return _CLASS_HEAD.match(data, line_start(data, position), position) is not None


def defines_class(data: bytes, name: str) -> bool:
    """Whether the file's bytes hold a class statement for `name`."""
    needle = name.encode()
    position = data.find(needle)
    while position >= 0:
        end = position + len(needle)
        if not _identifier_byte(data, end) and _defines_class(data, position):
            return True
        position = data.find(needle, end)
    return False


def _defines_class(data: bytes, position: int) -> bool:
    """Whether data[position:] is the name of a class statement (`class Name(...)` / `class Name:`)."""
    return _CLASS_NAME.match(data, line_start(data, position), position) is not None


_CLASS_NAME = re.compile(rb"[ \t]*class[ \t]+\Z")
_CLASS_HEAD = re.compile(rb"[ \t]*class\s+\w+\s*\([^)#]*\Z")


def _a_call_of(data: bytes, start: int, end: int, classes: set[str | None]) -> bool:
    if not code_use(data, start, end):
        return False
    receiver = _receiver_before(data, start)
    if receiver is None:
        return None in classes  # a plain function or a constructor, called or passed by its name
    if receiver in ("self", "cls", "super"):
        return False  # within a class: its own file, or a subclass's (found by its bases)
    if None in classes and receiver[:1].islower():
        return True  # `module.function(...)`
    return any(c is not None and receiver_fits(receiver, c) for c in classes)


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
