"""Join the reach facts of many files into one call graph: calls resolved between files by what the code shows.

A call goes to a method on `self` (the class, its bases in the tree, and overrides in its subclasses), a plain
or imported function, a nested function, or a method of the classes its receiver holds: what an annotation or a
constructor call names, what a called function returns (its returned value, else its return annotation), an
attribute of such an object (a class's own assignments first, then the annotations and constructor calls the
tree gives that attribute name). A class so given reaches its own (or inherited) method and its subclasses'
overrides, ranked by the receiver's name (`naming.receiver_fits`). A name never decides alone: a receiver
nothing types, or typed only with classes outside the tree (torch, the standard library), reaches nothing.
"""

from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path

from canary_instrument.rewrite.analysis.callgraph_links import CallIndex, DefKey
from canary_instrument.rewrite.analysis.modules import module_score
from canary_instrument.rewrite.analysis.reach_records import MODULE, DefFacts, Edge, ReachFacts, target_method
from canary_instrument.rewrite.syntax.naming import receiver_fits

ClassKey = tuple[int, str]  # (file index, class qualname)


class CallGraph:
    """Every function of the analysed files; the calls that can reach a trigger resolved both ways."""

    def __init__(self, files: list[tuple[Path, ReachFacts]]) -> None:
        self.files: list[tuple[Path, ReachFacts]] = []
        self.defs: dict[DefKey, DefFacts] = {}
        self.classes: dict[ClassKey, object] = {}
        self.classes_by_name: dict[str, list[ClassKey]] = defaultdict(list)
        self.functions_by_name: dict[str, list[DefKey]] = defaultdict(list)
        self.methods: dict[ClassKey, dict[str, DefKey]] = defaultdict(dict)
        self.methods_by_name: dict[str, list[DefKey]] = defaultdict(list)
        self.names: dict[str, set[str]] = defaultdict(set)
        self.modules: list[list[str]] = []
        # Folder names of the analysed files: a qualified name through one (`sglang.srt.`) is of this
        # tree even when its file was not analysed; one through none (`torch.`, `typing.`) is outside it.
        self.packages: set[str] = set()
        self.missing: set[str] | None = None  # when a set: unanalysed classes of the tree that typed a receiver
        self.missing_from: set[tuple[str, str]] = set()  # with `missing`: (class, the module the code imports it from)
        self.bases_wanted = False  # with `missing`: also the unanalysed bases of a class whose attribute is unknown
        self.unanalysed_bases: dict[str, set[str]] = {}  # with `bases_wanted`: method name -> bases wanted (`instances`)
        self._owners: dict[DefKey, ClassKey | None] = {}
        self.calls = CallIndex()
        self.add(files)

    def add(self, files: list[tuple[Path, ReachFacts]]) -> None:
        """Join more files' facts: the graph is then the one built from all the files so far, in order."""
        for index, (_, facts) in enumerate(files, start=len(self.files)):
            self.modules.append(facts.module.split(".") if facts.module else [])
            self.packages.update(self.modules[-1][:-1])
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
            self.calls.add(index, facts)
        self.files.extend(files)
        self._active: set[tuple] = set()  # resolutions under way (what a receiver holds may lead back to them)
        self._bases: dict[ClassKey, list[ClassKey]] = {}
        self.subclasses: dict[ClassKey, list[ClassKey]] = defaultdict(list)
        for key, cls in self.classes.items():
            bases = [b for q in cls.bases for b in self.classes_of(q)]
            self._bases[key] = bases
            for base in bases:
                self.subclasses[base].append(key)
        # Calls resolved both ways (`callees`, `callers`, and the `weak` ones, to an override only) for
        # the functions from which a path reaches a trigger: the only ones `uncovered` asks about.
        self.callees, self.callers, self.weak = self._link()

    def symbol(self, qualified: str) -> list:
        """The tree's classes ("class", key, rest) or functions ("def", key) a qualified name names."""
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
                score = module_score(module, self.modules[key[0]])
                if score == 0:
                    continue
                entry = ("class", key, tuple(rest)) if kind == "class" else ("def", key)
                if score > best:
                    best, found = score, [entry]
                elif score == best and entry not in found:
                    found.append(entry)
            if found:
                break
        return found

    def classes_of(self, qualified: str) -> list[ClassKey]:
        return [entry[1] for entry in self.symbol(qualified) if entry[0] == "class" and not entry[2]]

    def mro(self, key: ClassKey) -> list[ClassKey]:
        order, stack, seen = [], [key], set()
        while stack:
            current = stack.pop(0)
            if current in seen:
                continue
            seen.add(current)
            order.append(current)
            stack.extend(self._bases.get(current, ()))
        return order

    def descendants(self, key: ClassKey) -> list[ClassKey]:
        out, stack, seen = [], list(self.subclasses.get(key, ())), {key}
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                out.append(current)
                stack.extend(self.subclasses.get(current, ()))
        return out

    def method(self, key: ClassKey, name: str, overrides: bool = True) -> list[DefKey]:
        """`name` looked up on an instance of class `key` (or, with `overrides`, of any subclass)."""
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

    def attribute_types(self, cls: ClassKey | None, attribute: str) -> list:
        """What attribute `attribute` holds (qualified class names, or type sources of the class that
        assigns it): the class's own record (its bases included), else what a property of that name
        returns, else the annotations and constructor calls the tree gives the attribute name."""
        if cls is not None:
            for owner in self.mro(cls):
                facts = self.classes[owner]
                for name, types in facts.attrs:
                    if name == attribute:
                        return [t if isinstance(t, str) or t[0] == "q" else (*t, owner) for t in types]
            for key in self.method(cls, attribute, overrides=False):
                fn = self.defs[key]
                if fn.returned or fn.returns:
                    return [("returns", key, cls)]
            if self.missing is not None and self.bases_wanted:
                # A base not analysed may assign it or define it as a property: its definition is wanted.
                for owner in self.mro(cls):
                    for base in self.classes[owner].bases:
                        self._qualified(base, True)
        return sorted(self.names.get(attribute, ()))

    def classes_held(self, sources, cls: ClassKey | None, index: int | None, depth: int = 0,
                     fields: bool = False) -> list[ClassKey]:
        """The tree's classes whose instances the type sources describe (`reach` lists the kinds);
        `cls` is the class `self` is, `index` the file the sources were read in; `fields`: what is
        asked is an attribute of theirs (their definition is then wanted, `missing`)."""
        out: list[ClassKey] = []
        if depth > 6:
            return out  # a cycle of returns or attributes: what the code shows ends there
        for source in sources:
            if isinstance(source, str):
                out.extend(self._qualified(source, fields))
                continue
            kind = source[0]
            if kind == "q":
                out.extend(self._qualified(source[1], fields))
            elif kind == "attr":
                out.extend(self.classes_held(self.attribute_types(cls, source[1]), cls, index, depth + 1, fields))
            elif kind == "call":
                # Recorded with its owner class (`attribute_types`): read in that class's file.
                where = (source[3][0] if len(source) > 3 else index, source[2])
                if where[0] is not None and where in self.defs:
                    out.extend(self.returned_classes(self.resolve(where, source[1]), source[1], depth + 1, fields))
            elif kind == "get":
                inner_index = source[3][0] if len(source) > 3 else index
                for held in self.classes_held(source[1], cls, inner_index, depth + 1, True):
                    out.extend(self.classes_held(self.attribute_types(held, source[2]), held, held[0], depth + 1,
                                                 fields))
            elif kind == "returns":
                out.extend(self._returns_of(source[1], source[2], depth + 1, fields))
        return list(dict.fromkeys(out))

    def returned_classes(self, callees: list[DefKey], target: tuple, depth: int = 0,
                         fields: bool = False) -> list[ClassKey]:
        """The classes of what calls of `callees` return: a constructor's class, else the function's
        returned value or return annotation."""
        out: list[ClassKey] = []
        for key in callees:
            fn = self.defs[key]
            if fn.cls is not None and fn.qualname.rpartition(".")[2] == "__init__" and target[0] == "global":
                out.append((key[0], fn.cls))  # Foo(...): a Foo
            else:
                out.extend(self._returns_of(key, self.self_class(key), depth, fields))
        return out

    def _returns_of(self, key: DefKey, cls: ClassKey | None, depth: int, fields: bool = False) -> list[ClassKey]:
        fn = self.defs[key]
        found = self.classes_held(fn.returned, cls, key[0], depth + 1, fields) if fn.returned else []
        return found or self.classes_held(fn.returns, cls, key[0], depth + 1, fields)

    def _qualified(self, qualified: str, fields: bool) -> list[ClassKey]:
        found = self.classes_of(qualified)
        if not found and fields and self.missing is not None and not self.packages.isdisjoint(qualified.split(".")[:-1]):
            module, _, name = qualified.rpartition(".")
            self.missing.add(name)  # a class of this tree whose file was not analysed
            self.missing_from.add((name, module))
        return found

    def instances(self, types, name: str, cls: ClassKey | None, caller: DefKey | None = None,
                  word: str | None = None) -> list[DefKey]:
        """Methods `name` of the objects the type sources describe, ranked by the receiver's name
        `word`: the classes it fits when any does, else all of them. None of the tree's: nothing.
        While `bases_wanted`, a class of the tree, not analysed, that alone types the receiver and is
        a base of a class whose method `name` is wanted (`unanalysed_bases`) is wanted too (`missing`):
        the call may run that class's override. So is such a base when analysed classes type the receiver:
        the wanted class may derive from them through it."""
        index = caller[0] if caller is not None else None
        classes = self.classes_held(types, cls, index)
        bases = self.unanalysed_bases.get(name) if self.bases_wanted and self.missing is not None else None
        if classes and bases:
            self.missing |= bases
        if not classes and bases:
            missing, missing_from = self.missing, self.missing_from
            self.missing, self.missing_from = set(), set()
            try:
                self.classes_held(types, cls, index, fields=True)
            finally:
                missing |= self.missing & bases
                missing_from |= {(n, m) for n, m in self.missing_from if n in bases}
                self.missing, self.missing_from = missing, missing_from
        return self.methods_of(classes, name, word)

    def unanalysed_base_names(self, key: ClassKey) -> set[str]:
        """The names of the bases, of this tree and not analysed, of the class and its analysed bases."""
        out = set()
        for owner in self.mro(key):
            for base in self.classes[owner].bases:
                if not self.classes_of(base) and not self.packages.isdisjoint(base.split(".")[:-1]):
                    out.add(base.rpartition(".")[2])
        return out

    def methods_of(self, classes: list[ClassKey], name: str, word: str | None = None) -> list[DefKey]:
        """`name` on instances of `classes`: each class's own (or inherited) method, and the overrides in
        their subclasses, of which the receiver's name `word` keeps those of the classes it fits (all
        of them when it fits none): a class the code names is never dropped for its name."""
        found: list[DefKey] = []
        overrides: list[DefKey] = []
        for key in classes:
            for method in self.method(key, name, overrides=False):
                if method not in found:
                    found.append(method)
        for key in classes:
            for method in self.method(key, name)[1:] if self.method(key, name, overrides=False) else self.method(key, name):
                if method not in found and method not in overrides:
                    overrides.append(method)
        if word is not None and len(overrides) > 1:
            fitting = [key for key in overrides if receiver_fits(word, self.defs[key].cls.rpartition(".")[2])]
            overrides = fitting or overrides
        if not overrides or not found:
            return found + overrides
        resolved = _Resolved(found + overrides)
        resolved.overrides = frozenset(overrides)  # a subclass's override: a call that may not run there
        return resolved

    def resolve(self, caller: DefKey, target: tuple, call: bool = True) -> list[DefKey]:
        # A resolution under way is known by what it depends on: the caller only through its file and
        # class, and for a qualified name or a receiver that is not `self`'s not at all (`_resolve`).
        kind = target[0]
        if self.missing is None and (name := target_method(target)) is not None and name not in self.methods_by_name:
            return []  # no analysed class has a method of that name (a caller search, `missing`, follows every call)
        if kind in _CALLER_FREE or (kind == "attr" and not target[3]):
            under_way = (target, call)
        else:
            under_way = (caller[0], self.self_class(caller), target, call)
        if under_way in self._active:
            return []  # a call whose receiver is what this very call returns: the code shows no more
        self._active.add(under_way)
        try:
            return self._resolve(caller, target, call)
        finally:
            self._active.discard(under_way)

    def _resolve(self, caller: DefKey, target: tuple, call: bool) -> list[DefKey]:
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
            found = self.instances(self.attribute_types(cls, word), name, cls, caller, word)
        elif kind == "var":
            _, word, name = target
            found = self.instances(sorted(self.names.get(word, ())), name, None, caller, word)
        elif kind == "typed":
            found = self.instances(target[1], target[2], self.self_class(caller), caller)
        elif kind == "ret":
            _, inner, name, word = target
            callees = self.resolve(caller, inner) if inner is not None else []
            found = self.methods_of(self.returned_classes(callees, inner), name, word)
        else:  # "name": `self.runners[i].m()`, nothing shows what the element is
            found = []
        return found

    def _link(self) -> tuple[dict, dict, set]:
        """(callees, callers, weak) of every function from which a path reaches a trigger or a KV-reading
        forward, in the order of the functions and their calls (as if every call were resolved): a path
        shown in a finding is the first one found in that order. `weak`: the (caller, callee) pairs where
        the callee is only a subclass's override of the method the receiver's class has (real calls, but
        a path shown in a finding goes another way if it can).

        `uncovered` asks only about such functions (whether a path reaches one outside every site, who
        calls one, whether one is exposed); a function that reaches none can call one of them only by
        spelling its name, so they are found backwards from the triggers, by name (`calls`), and no other
        call of the tree is resolved. Leaving the others unresolved changes neither which of them is
        exposed nor the first path found to it (`uncovered.exposed` meets them in the same order)."""
        callees: dict[DefKey, list[tuple[DefKey, Edge]]] = {}
        callers: dict[DefKey, list[tuple[DefKey, Edge]]] = defaultdict(list)
        weak_calls: set[tuple[DefKey, DefKey]] = set()
        spelling = self.calls.spelling
        reaching = {key for key, fn in self.defs.items() if fn.triggers or fn.kv}
        queue = deque(reaching)
        while queue:
            key = queue.popleft()
            for name in self._call_names(key):
                for caller, edge in spelling.get(name, ()):
                    if caller not in reaching and key in self.resolve(caller, edge.target, edge.call):
                        reaching.add(caller)
                        queue.append(caller)
        for key, fn in self.defs.items():
            if key not in reaching:
                continue
            out = []
            for edge in fn.edges:
                targets = self.resolve(key, edge.target, edge.call)
                weak = getattr(targets, "overrides", None)
                for target in targets:
                    if target != key:
                        out.append((target, edge))
                        callers[target].append((key, edge))
                        if weak and target in weak:
                            weak_calls.add((key, target))
            callees[key] = out
        return callees, callers, weak_calls

    def _call_names(self, key: DefKey) -> set[str]:
        """The names a call of function `key` can spell: its own, and for a constructor the name of its
        class or of any subclass that inherits it."""
        fn = self.defs[key]
        name = fn.qualname.rpartition(".")[2]
        names = {name}
        if fn.cls is not None and name == "__init__":
            cls = (key[0], fn.cls)
            names.update(c[1].rpartition(".")[2] for c in (cls, *self.descendants(cls)))
        return names


class _Resolved(list):
    """Methods a call may run, with those that are only subclasses' overrides marked."""
    overrides: frozenset = frozenset()


# Target kinds whose resolution does not depend on the calling function (see `_resolve`).
_CALLER_FREE = frozenset(("global", "var", "name"))
