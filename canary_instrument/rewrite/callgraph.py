"""Join the reach facts of many files into one call graph: calls resolved by name between files.

Resolution is by name and cheap on purpose: a method on `self` (the class, its bases in the tree,
and overrides in its subclasses), on an attribute or variable whose class an annotation or a
constructor names somewhere in the tree, a plain or imported function, a nested function. A call
whose receiver nothing types goes to every method of that name in a class the receiver's name fits
(`naming.receiver_fits`; every such method, when the receiver has no name); one whose receiver is
typed with a class outside the tree (torch, the standard library) goes nowhere.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from canary_instrument.rewrite.naming import receiver_fits
from canary_instrument.rewrite.reach import MODULE, DefFacts, Edge, ReachFacts

DefKey = tuple[int, str]  # (file index, function qualname)
ClassKey = tuple[int, str]  # (file index, class qualname)


class CallGraph:
    """Every function of the analysed files, with resolved edges both ways."""

    def __init__(self, files: list[tuple[Path, ReachFacts]]) -> None:
        self.files = files
        self.defs: dict[DefKey, DefFacts] = {}
        self.classes: dict[ClassKey, object] = {}
        self.classes_by_name: dict[str, list[ClassKey]] = defaultdict(list)
        self.functions_by_name: dict[str, list[DefKey]] = defaultdict(list)
        self.methods: dict[ClassKey, dict[str, DefKey]] = defaultdict(dict)
        self.methods_by_name: dict[str, list[DefKey]] = defaultdict(list)
        self.names: dict[str, set[str]] = defaultdict(set)
        self.modules = [facts.module.split(".") if facts.module else [] for _, facts in files]
        # Folder names of the analysed files: a qualified name through one (`sglang.srt.`) is of this
        # tree even when its file was not analysed; one through none (`torch.`, `typing.`) is outside it.
        self.packages = {part for parts in self.modules for part in parts[:-1]}
        self.missing: set[str] | None = None  # when a set: unanalysed classes whose calls naming resolved
        self._unanalysed: list[str] = []
        for index, (_, facts) in enumerate(files):
            for cls in facts.classes:
                key = (index, cls.qualname)
                self.classes[key] = cls
                self.classes_by_name[cls.qualname.rpartition(".")[2]].append(key)
            for fn in facts.defs:
                key = (index, fn.qualname)
                self.defs[key] = fn
                if fn.cls is not None:
                    method = fn.qualname.rpartition(".")[2]
                    self.methods[(index, fn.cls)][method] = key
                    self.methods_by_name[method].append(key)
                elif "." not in fn.qualname and fn.qualname != MODULE:
                    self.functions_by_name[fn.qualname].append(key)
            for name, types in facts.names:
                self.names[name].update(types)
        self._symbols: dict[str, list] = {}
        self._mro: dict[ClassKey, list[ClassKey]] = {}
        self._descendants: dict[ClassKey, list[ClassKey]] = {}
        self._method: dict[tuple, list[DefKey]] = {}
        self._resolved: dict[tuple, list[DefKey]] = {}
        self._bases: dict[ClassKey, list[ClassKey]] = {}
        self._owners: dict[DefKey, ClassKey | None] = {}
        self.subclasses: dict[ClassKey, list[ClassKey]] = defaultdict(list)
        for key, cls in self.classes.items():
            bases = [b for q in cls.bases for b in self.classes_of(q)]
            self._bases[key] = bases
            for base in bases:
                self.subclasses[base].append(key)
        self.callees: dict[DefKey, list[tuple[DefKey, Edge]]] = {}
        self.callers: dict[DefKey, list[tuple[DefKey, Edge]]] = defaultdict(list)
        for key, fn in self.defs.items():
            out = []
            for edge in fn.edges:
                for target in self.resolve(key, edge.target, edge.call):
                    if target != key:
                        out.append((target, edge))
                        self.callers[target].append((key, edge))
            self.callees[key] = out

    # -- symbols -------------------------------------------------------------------------------------
    def symbol(self, qualified: str) -> list:
        """The tree's classes ("class", key, rest) or functions ("def", key) a qualified name names."""
        cached = self._symbols.get(qualified)
        if cached is not None:
            return cached
        parts = qualified.split(".")
        found: list = []
        best = 0
        classes_by_name, functions_by_name = self.classes_by_name, self.functions_by_name
        for split in range(len(parts) - 1, 0, -1):
            head = parts[split]
            if head not in classes_by_name and head not in functions_by_name:
                continue  # most names (`torch.nn.functional.pad`) name nothing of the tree at any split
            module, rest = parts[:split], parts[split + 1 :]
            candidates = [("class", k) for k in classes_by_name.get(head, ()) if "." not in k[1]]
            candidates += [("def", k) for k in functions_by_name.get(head, ())]
            for kind, key in candidates:
                score = _module_score(module, self.modules[key[0]])
                if score == 0:
                    continue
                entry = ("class", key, tuple(rest)) if kind == "class" else ("def", key)
                if score > best:
                    best, found = score, [entry]
                elif score == best and entry not in found:
                    found.append(entry)
            if found:
                break
        self._symbols[qualified] = found
        return found

    def classes_of(self, qualified: str) -> list[ClassKey]:
        return [entry[1] for entry in self.symbol(qualified) if entry[0] == "class" and not entry[2]]

    def mro(self, key: ClassKey) -> list[ClassKey]:
        cached = self._mro.get(key)
        if cached is not None:
            return cached
        order, stack, seen = [], [key], set()
        while stack:
            current = stack.pop(0)
            if current in seen:
                continue
            seen.add(current)
            order.append(current)
            stack.extend(self._bases.get(current, ()))
        self._mro[key] = order
        return order

    def descendants(self, key: ClassKey) -> list[ClassKey]:
        cached = self._descendants.get(key)
        if cached is not None:
            return cached
        out, stack, seen = [], list(self.subclasses.get(key, ())), {key}
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                out.append(current)
                stack.extend(self.subclasses.get(current, ()))
        self._descendants[key] = out
        return out

    def method(self, key: ClassKey, name: str, overrides: bool = True) -> list[DefKey]:
        """`name` looked up on an instance of class `key` (or, with `overrides`, of any subclass)."""
        memo = (key, name, overrides)
        cached = self._method.get(memo)
        if cached is not None:
            return cached
        found = []
        for cls in self.mro(key):
            target = self.methods.get(cls, {}).get(name)
            if target is not None:
                found.append(target)
                break
        if overrides:
            for sub in self.descendants(key):
                target = self.methods.get(sub, {}).get(name)
                if target is not None:
                    found.append(target)
        self._method[memo] = found
        return found

    def self_class(self, key: DefKey) -> ClassKey | None:
        if key in self._owners:
            return self._owners[key]
        fn = self.defs[key]
        owner = None
        if fn.cls is not None:
            owner = (key[0], fn.cls)
        elif ".<locals>." in fn.qualname:
            outer = self.defs.get((key[0], fn.qualname.split(".<locals>.")[0]))
            if outer is not None and outer.cls is not None:
                owner = (key[0], outer.cls)
        self._owners[key] = owner
        return owner

    def attribute_types(self, cls: ClassKey | None, attribute: str) -> list[str]:
        """Qualified classes attribute `attribute` holds: the class's own record, else the tree's."""
        if cls is not None:
            for owner in self.mro(cls):
                facts = self.classes[owner]
                for name, types in facts.attrs:
                    if name == attribute:
                        return list(types)
        return sorted(self.names.get(attribute, ()))

    def instances(self, types, name: str, cls: ClassKey | None) -> list[DefKey] | None:
        """Methods `name` of the objects the type sources describe; None when they say nothing useful
        (naming decides), [] when they name only classes outside the tree (torch, typing, ...)."""
        qualified = []
        for source in types:
            if isinstance(source, tuple):
                if source[0] == "q":
                    qualified.append(source[1])
                elif source[0] == "attr":
                    qualified.extend(self.attribute_types(cls, source[1]))
            else:
                qualified.append(source)
        classes: list[ClassKey] = []
        unknown = not qualified
        for q in qualified:
            found = self.classes_of(q)
            classes.extend(found)
            if not found and not self.packages.isdisjoint(q.split(".")[:-1]):
                unknown = True  # a class of this tree whose file was not analysed
                self._unanalysed.append(q.rpartition(".")[2])
        return self.methods_of(classes, name, unknown)

    def methods_of(self, classes: list[ClassKey], name: str, unknown: bool) -> list[DefKey] | None:
        """`name` on instances of `classes`; None (naming decides) when they are not known or none of
        them has the method (an annotation wider than the object)."""
        found = []
        for key in classes:
            found.extend(self.method(key, name))
        if found:
            return found
        return None if unknown or classes else []

    # -- resolution ----------------------------------------------------------------------------------
    def resolve(self, caller: DefKey, target: tuple, call: bool = True) -> list[DefKey]:
        # What a call resolves to depends on the caller only through its file and class, and for a
        # qualified name or a receiver that is not `self`'s not at all (`_resolve`).
        kind = target[0]
        if kind in _CALLER_FREE or (kind == "attr" and not target[3]):
            memo = (target, call)
        else:
            memo = (caller[0], self.self_class(caller), target, call)
        if self.missing is None:
            cached = self._resolved.get(memo)
            if cached is not None:
                return cached
        found = self._resolve(caller, target, call)
        self._resolved[memo] = found
        return found

    def _resolve(self, caller: DefKey, target: tuple, call: bool) -> list[DefKey]:
        self._unanalysed = []
        kind = target[0]
        index = caller[0]
        if kind == "self":
            cls = self.self_class(caller)
            return self.method(cls, target[1]) if cls is not None else []
        if kind == "def":
            key = (index, target[1])
            return [key] if key in self.defs else []
        if kind == "global":
            found = []
            for entry in self.symbol(target[1]):
                if entry[0] == "def":
                    found.append(entry[1])
                elif entry[2]:
                    if len(entry[2]) == 1:
                        found.extend(self.method(entry[1], entry[2][0], overrides=False))
                elif call:
                    found.extend(self.method(entry[1], "__init__", overrides=False))
            return found
        if not call:
            return []
        if kind == "super":
            cls = self.self_class(caller)
            if cls is None:
                return []
            for base in self.mro(cls)[1:]:
                method = self.methods.get(base, {}).get(target[1])
                if method is not None:
                    return [method]
            return []
        if kind == "attr":
            _, word, name, on_self = target
            cls = self.self_class(caller) if on_self else None
            found = self.instances(self.attribute_types(cls, word), name, cls)
        elif kind == "var":
            _, word, name = target
            found = self.instances(sorted(self.names.get(word, ())), name, None)
        elif kind == "typed":
            return self.instances(target[1], target[2], self.self_class(caller)) or []
        elif kind == "ret":
            _, inner, name, word = target
            found = None
            for key in self.resolve(caller, inner) if inner is not None else ():
                fn = self.defs[key]
                if inner[0] == "global" and fn.qualname.rpartition(".")[2] == "__init__" and fn.cls is not None:
                    got = self.methods_of([(key[0], fn.cls)], name, True)  # Foo(...).m(): a Foo
                else:
                    got = self.instances(fn.returns, name, self.self_class(key)) if fn.returns else None
                if got is not None:
                    found = (found or []) + got
        else:  # "name"
            _, name, word = target
            found = None
        if found is not None:
            return found
        by_naming = [
            key for key in self.methods_by_name.get(name, ())
            if receiver_fits(word, self.defs[key].cls.rpartition(".")[2])
        ]
        if by_naming and self.missing is not None:
            self.missing.update(self._unanalysed)  # its class would say which one it really is
        return by_naming

    def describe(self, key: DefKey) -> str:
        """`Class.method`, `module.function`, `Class.method.inner` for a nested function."""
        fn = self.defs[key]
        name = fn.qualname.replace(".<locals>.", ".")
        outer = fn.qualname.split(".<locals>.")[0]
        if fn.qualname != MODULE and "." not in outer:  # a module-level function (or one nested in it)
            module = self.files[key[0]][1].module.rpartition(".")[2]
            name = f"{module}.{name}" if module else name
        return name


# Target kinds whose resolution does not depend on the calling function (see `_resolve`).
_CALLER_FREE = frozenset(("global", "var", "name"))


def _module_score(module: list[str], file_module: list[str]) -> int:
    """How well an import's module path names a file: the length of their common dotted suffix
    (`sglang.srt.a.b` names `.../srt/a/b.py` by `srt.a.b`), or of the package for a re-export."""
    score = _common_suffix(module, file_module)
    if score:
        return score * 2
    # `from pkg import Name` where pkg/__init__.py re-exports Name from pkg/mod.py.
    return max(0, _common_suffix(module, file_module[:-1]) * 2 - 1)


def _common_suffix(first: list[str], second: list[str]) -> int:
    count = 0
    for a, b in zip(reversed(first), reversed(second)):
        if a != b:
            break
        count += 1
    return count
