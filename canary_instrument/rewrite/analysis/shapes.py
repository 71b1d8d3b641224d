"""Who holds a model runner, and the questions about a class the site and hook finders ask (its syntax
facts are `syntax.scopes.ClassScope`).

Standard-library `ast` only (`check` uses it).
"""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatchcase

from canary_instrument.catalog import ModelRunnerShape, call_matches
from canary_instrument.rewrite.syntax.nodes import dotted_name, parameters
from canary_instrument.rewrite.syntax.scopes import ClassScope, built_with_flag, local_bindings


def names_runner(name: str, shape: ModelRunnerShape) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in shape.names)


def function_model_runner(function, shape: ModelRunnerShape) -> str | None:
    """How a module-level function reaches a model runner: a parameter named or typed like one, else a local."""
    for arg in parameters(function):
        annotation = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else ""
        if names_runner(arg.arg, shape) or any(fnmatchcase(annotation, t) for t in shape.types if annotation):
            return arg.arg
    for name, value in local_bindings(function):
        if "." in value and (names_runner(value.rpartition(".")[2], shape) or names_runner(name, shape)):
            return name
    return None


class ClassFacts(ClassScope):
    """What the finders ask about a class: whether it reaches a manager's owner, holds or is a model
    runner, answered from its syntax facts."""

    def reaches(self, owner: str) -> bool:
        """True when the class uses `owner` (`self.model_runner`), so it can reach a manager held there."""
        if owner == "self":
            return True
        found = self.answers.get(("reaches", owner))
        if found is None:
            # A ref that starts with `owner.` holds `owner` itself: each link of a chain is a ref. A property
            # of the class that `owner` names (`def draft_runner(self)`) is the attribute too.
            found = self.answers[("reaches", owner)] = self.has_property(owner) or owner in self.refs
        return found

    def has_property(self, owner: str) -> bool:
        """Whether `owner` (`self.x`) is a property the class defines."""
        method = self.methods.get(owner[5:]) if owner.startswith("self.") and owner.count(".") == 1 else None
        return method is not None and any(
            (d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)) in ("property", "cached_property")
            for d in method.decorator_list
        )

    def held_as(self, owner: str, shape: ModelRunnerShape, draft_flag: str | None = None) -> str | None:
        """Where the class holds, under a name of its own, the model runner a manager's `owner` names.

        Only for an owner (`self.draft_runner`) the class never uses and whose name the model-runner shape
        does not recognise: the attribute it assigns a model runner (`self.drafter = self.worker.model_runner`,
        `self.drafter = ModelRunner(...)`, a property returning one). Several names for the same value are one
        runner (the first is taken); different ones are told apart by the one built from an object constructed
        with `draft_flag=True`; None when that leaves no single one.
        """
        if not owner.startswith("self.") or owner.count(".") != 1 or self.reaches(owner):
            return None
        if names_runner(owner[5:], shape):
            return None
        held = self.runner_attributes(shape)
        if len(held) > 1 and len(set(held.values())) == 1:  # names for one runner (properties returning it)
            held = dict([next(iter(held.items()))])
        if len(held) > 1 and draft_flag:
            drafts = self.flagged_attributes(draft_flag)
            held = {name: value for name, value in held.items() if value.split(".")[:2] in drafts}
        return f"self.{next(iter(held))}" if len(held) == 1 else None

    def runner_attributes(self, shape: ModelRunnerShape) -> dict[str, str]:
        """`self.NAME = VALUE` assignments of a model runner, and properties that return one: NAME -> VALUE's dotted
        name (a constructor: its callee)."""
        found: dict[str, str] = {}
        for node in self.assignments:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if isinstance(value, ast.Call):
                spelled = dotted_name(value.func) or ""
                runner = any(fnmatchcase(spelled.rpartition(".")[2], t) for t in shape.types)
            else:
                spelled = dotted_name(value) or ""
                runner = "." in spelled and names_runner(spelled.rpartition(".")[2], shape)
            for name in map(dotted_name, targets):
                if runner and name is not None and name.count(".") == 1 and name.startswith("self."):
                    found.setdefault(name[5:], spelled)
        # A property that returns a model runner (`return self.model_runner`) holds it under its own name too.
        for name, method in self.methods.items():
            body = [s for s in method.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if self.has_property(f"self.{name}") and len(body) == 1 and isinstance(body[0], ast.Return):
                spelled = dotted_name(body[0].value) or ""
                if "." in spelled and names_runner(spelled.rpartition(".")[2], shape):
                    found.setdefault(name, spelled)
        return found

    def flagged_attributes(self, flag: str) -> list[list[str]]:
        """The `self.NAME` attributes (as ["self", NAME]) assigned an object constructed with `flag=True`."""
        return [
            name.split(".") for node in self.assignments
            if isinstance(node, ast.Assign) and built_with_flag(node.value, flag)
            for t in node.targets if (name := dotted_name(t)) is not None
        ]

    def refers_to(self, patterns) -> bool:
        return any(fnmatchcase(ref, pattern) for ref in self.refs for pattern in patterns)

    def is_model_runner(self, shape: ModelRunnerShape) -> bool:
        """It calls the raw forward, or is named as the model runner type (a runner whose forward moved)."""
        found = self.answers.get(("is_model_runner", shape))
        if found is None:
            found = self.answers[("is_model_runner", shape)] = self._is_model_runner(shape)
        return found

    def _is_model_runner(self, shape: ModelRunnerShape) -> bool:
        if any(fnmatchcase(self.node.name, pattern) for pattern in shape.types):
            return True
        return any(call_matches(name, pattern) for name in self.calls for pattern in shape.class_calls)

    def held_model_runner(self, shape: ModelRunnerShape) -> str | None:
        """The most used `self....model_runner` chain of a class that holds a model runner, else None."""
        key = ("held_model_runner", shape)
        if key not in self.answers:
            self.answers[key] = self._held_model_runner(shape)
        return self.answers[key]

    def _held_model_runner(self, shape: ModelRunnerShape) -> str | None:
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


def batch_variable(function, name: str, kv_forward) -> str | None:
    """The function's own name for the forward batch when `name` (the wiring's) is not bound in it: the one
    parameter or local annotated with one of `kv_forward.batch_types`, or the one local a constructor of such
    a type builds (`ForwardBatch(...)`, `ForwardBatch.init_new(...)`); None when `name` is bound or no single
    one is found (the wiring keeps `name`, which CI207 then reports as undefined)."""
    def typed(annotation) -> bool:
        text = ast.unparse(annotation).strip("'\"") if annotation is not None else ""
        return any(fnmatchcase(word, pattern) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
                   for pattern in kv_forward.batch_types)

    def built(value) -> bool:
        call = value if isinstance(value, ast.Call) else None
        dotted = dotted_name(call.func) if call is not None else None
        return dotted is not None and any(
            fnmatchcase(part, pattern) for part in dotted.split(".")[:2] for pattern in kv_forward.batch_types)

    bound: set[str] = {arg.arg for arg in parameters(function)}
    found: list[str] = [arg.arg for arg in parameters(function) if typed(arg.annotation)]
    for node in ast.walk(function):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
            if typed(node.annotation) or (node.value is not None and built(node.value)):
                found.append(node.target.id)
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            bound.update(names)
            if built(node.value):
                found.extend(names)
    if name in bound:
        return None
    unique = sorted(set(found))
    return unique[0] if len(unique) == 1 else None
