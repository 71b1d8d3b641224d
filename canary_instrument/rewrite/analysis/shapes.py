"""Who holds a model runner, and the facts of a class the site and hook finders ask about.

Standard-library `ast` only (`check` uses it).
"""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatchcase

from canary_instrument.catalog import ModelRunnerShape, call_matches
from canary_instrument.rewrite.syntax.nodes import FUNCTIONS, dotted_name, parameters, refs_and_calls, walk


def names_runner(name: str, shape: ModelRunnerShape) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in shape.names)


def function_model_runner(function, shape: ModelRunnerShape) -> str | None:
    """How a module-level function reaches a model runner: a parameter named or typed like one, else a local."""
    for arg in parameters(function):
        annotation = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else ""
        if names_runner(arg.arg, shape) or any(fnmatchcase(annotation, t) for t in shape.types if annotation):
            return arg.arg
    for node in walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = dotted_name(node.value)
            name = node.targets[0].id
            if value is not None and (names_runner(value.rpartition(".")[2], shape) or names_runner(name, shape)):
                if "()" not in value and value.rpartition(".")[2] != value:
                    return name
    return None


def _fragments(pattern: str) -> list[str]:
    """The runs of identifier characters that every name matching a shell-style `pattern` holds
    (`*capture_*_graph` -> capture_, _graph); a bracket expression stands for one unknown character."""
    return re.findall(r"\w+", re.sub(r"\[[^\]]*\]", "*", pattern))


def may_name(text: str | None, patterns) -> bool:
    """False when `text` (source code) cannot hold a name matching any of `patterns`: some run of
    identifier characters of each pattern is missing from it. True when unsure (no text)."""
    if text is None:
        return True
    return any(all(part in text for part in _fragments(pattern)) for pattern in patterns)


class ClassFacts:
    """What a class refers to and calls, computed once per class and only when a finder asks.

    `text` (the class's source lines) lets a question about names the class never spells be answered
    without walking it: a file's classes are asked about on every hook search, and most cannot matter.
    """

    def __init__(self, cls: ast.ClassDef, text: str | None = None) -> None:
        self.node = cls
        self.text = text
        self.methods = {stmt.name: stmt for stmt in cls.body if isinstance(stmt, FUNCTIONS)}
        self._refs: set[str] | None = None
        self._calls: list[str] | None = None

    @property
    def refs(self) -> set[str]:
        """Every dotted name the class's code reads or writes (`self.a.b`, `self.a`, `self`), nested classes aside."""
        if self._refs is None:
            self._collect()
        return self._refs

    @property
    def calls(self) -> list[str]:
        """The dotted name of every call in the class's code, nested classes aside."""
        if self._calls is None:
            self._collect()
        return self._calls

    def _collect(self) -> None:
        self._refs, self._calls = refs_and_calls(self.node.body)

    def reaches(self, owner: str) -> bool:
        """True when the class uses `owner` (`self.model_runner`), so it can reach a manager held there."""
        if owner == "self":
            return True
        if not may_name(self.text, [owner]):
            return False
        return any(ref == owner or ref.startswith(owner + ".") for ref in self.refs)

    def held_as(self, owner: str, shape: ModelRunnerShape, draft_flag: str | None = None) -> str | None:
        """Where the class holds, under a name of its own, the model runner a manager's `owner` names.

        Only for an owner (`self.draft_runner`) the class never uses and whose name the model-runner shape
        does not recognise: the attribute it assigns a model runner (`self.drafter = self.worker.model_runner`,
        `self.drafter = ModelRunner(...)`). Several such attributes are told apart by the one built from an
        object constructed with `draft_flag=True`; None when that leaves no single one.
        """
        if not owner.startswith("self.") or owner.count(".") != 1 or self.reaches(owner):
            return None
        if names_runner(owner[5:], shape):
            return None
        held = self.runner_attributes(shape)
        if len(held) > 1 and draft_flag:
            drafts = self.flagged_attributes(draft_flag)
            held = {name: value for name, value in held.items() if value.split(".")[:2] in drafts}
        return f"self.{next(iter(held))}" if len(held) == 1 else None

    def runner_attributes(self, shape: ModelRunnerShape) -> dict[str, str]:
        """`self.NAME = VALUE` assignments of a model runner: NAME -> VALUE's dotted name (a constructor: its callee)."""
        found: dict[str, str] = {}
        for function in self.methods.values():
            for node in walk(function):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [dotted_name(t) for t in targets]
                value = node.value
                if isinstance(value, ast.Call):
                    callee = dotted_name(value.func) or ""
                    runner = any(fnmatchcase(callee.rpartition(".")[2], t) for t in shape.types)
                    spelled = callee
                else:
                    spelled = dotted_name(value) or ""
                    runner = "." in spelled and names_runner(spelled.rpartition(".")[2], shape)
                for name in names:
                    if runner and name is not None and name.count(".") == 1 and name.startswith("self."):
                        found.setdefault(name[5:], spelled)
        return found

    def flagged_attributes(self, flag: str) -> list[list[str]]:
        """The `self.NAME` attributes (as ["self", NAME]) assigned an object constructed with `flag=True`."""
        found = []
        for function in self.methods.values():
            for node in walk(function):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                    k.arg == flag and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.value.keywords
                ):
                    found += [name.split(".") for t in node.targets if (name := dotted_name(t)) is not None]
        return found

    def refers_to(self, patterns) -> bool:
        if not may_name(self.text, patterns):
            return False
        return any(fnmatchcase(ref, pattern) for ref in self.refs for pattern in patterns)

    def is_model_runner(self, shape: ModelRunnerShape) -> bool:
        """It calls the raw forward, or is named as the model runner type (a runner whose forward moved)."""
        if any(fnmatchcase(self.node.name, pattern) for pattern in shape.types):
            return True
        if not may_name(self.text, shape.class_calls):
            return False
        return any(call_matches(name, pattern) for name in self.calls for pattern in shape.class_calls)

    def held_model_runner(self, shape: ModelRunnerShape) -> str | None:
        """The most used `self....model_runner` chain of a class that holds a model runner, else None."""
        if not may_name(self.text, shape.names):
            return None
        counts: dict[str, int] = {}
        for ref in self.refs:
            parts = ref.split(".")
            for end in range(2, len(parts) + 1):
                if parts[0] == "self" and names_runner(parts[end - 1], shape):
                    chain = ".".join(parts[:end])
                    counts[chain] = counts.get(chain, 0) + 1
                    break
        if not counts:
            return None
        # refs is a set, so count how many distinct references pass through each chain.
        return max(sorted(counts), key=lambda chain: (counts[chain], -len(chain)))
