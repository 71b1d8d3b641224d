"""The runtime's parseable log lines: a prefix, then ``name=value`` fields separated by spaces."""

from __future__ import annotations

import re
from typing import Optional

_FIELD = re.compile(r"(\w+)=(\S+)")


def fields_after(line: str, prefix: str) -> Optional[list]:
    """The ``(name, value)`` pairs after ``prefix`` in ``line``, in order; None when the line has no ``prefix``."""
    at = line.find(prefix)
    if at < 0:
        return None
    return _FIELD.findall(line[at + len(prefix):])


class LogLine:
    """A record logged as one parseable line: ``PREFIX``, then its fields; ``from_fields`` builds it back."""

    PREFIX = ""
    LINE_NAME = ""  # what a malformed-line error calls it; PREFIX when empty

    def fields(self) -> list:
        """The line's ``(name, value)`` pairs, in order."""
        raise NotImplementedError

    def format(self) -> str:
        return " ".join([self.PREFIX, *(f"{name}={value}" for name, value in self.fields())])

    @classmethod
    def from_fields(cls, fields: list) -> "LogLine":
        """The record of a line's ``(name, value)`` pairs; KeyError or ValueError when one is missing or bad."""
        raise NotImplementedError

    @classmethod
    def parse(cls, line: str) -> Optional["LogLine"]:
        """The record a log line carries, or None when the line has none; ValueError when malformed."""
        fields = fields_after(line, cls.PREFIX)
        if fields is None:
            return None
        try:
            return cls.from_fields(fields)
        except (KeyError, ValueError) as err:
            raise ValueError(f"malformed {cls.LINE_NAME or cls.PREFIX} line ({err}): {line!r}") from None

    @classmethod
    def find_all(cls, text: str) -> list:
        """Every record in a log text, in order."""
        return [r for r in (cls.parse(line) for line in text.splitlines()) if r is not None]
