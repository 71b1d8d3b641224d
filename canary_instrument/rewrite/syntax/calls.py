"""Calls under a node and tests of their dotted names against the catalog's call patterns."""

from __future__ import annotations

import ast
import fnmatch
import re
from functools import lru_cache

from canary_instrument.catalog import call_matches
from canary_instrument.rewrite.syntax.nodes import dotted_name, iter_calls


def call_pattern(patterns) -> str:
    """One regex source for `call_matches` over `patterns`: each pattern, bare or after any dotted prefix."""
    parts = [fnmatch.translate(p) for pattern in patterns for p in (pattern, "*." + pattern)]
    return "|".join(f"(?:{part})" for part in parts)


def call_names(node: ast.AST, into_functions: bool = False) -> list[str]:
    return [name for call in iter_calls(node, into_functions) if (name := dotted_name(call.func)) is not None]


@lru_cache(maxsize=None)
def calls_matcher(patterns: tuple[str, ...]):
    """A test of a dotted call name: true when `call_matches` holds for one of `patterns` (one regex,
    not two `fnmatchcase` per pattern: finders test every call of a class)."""
    regex = re.compile(call_pattern(patterns) or "(?!)")
    return lambda name: regex.match(name) is not None


def matched_patterns(names, patterns) -> set[str]:
    """The patterns that at least one of the dotted call names matches."""
    return {pattern for pattern in patterns if any(call_matches(name, pattern) for name in names)}


def calls_any(node: ast.AST, patterns) -> bool:
    return bool(matched_patterns(call_names(node), patterns))
