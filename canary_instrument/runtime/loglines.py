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
