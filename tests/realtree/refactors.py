"""Natural refactors of a released sglang `srt` tree: code `apply` has never seen (issue 20, deliverable 5).

Each refactor turns a copy of a tree (the `sglang/srt` folder) into a coherent program that a fork or a
later release might be: a class, method, module, package folder or attribute renamed everywhere, a
parameter renamed in its method, a method body moved into a helper, a draft worker that inlines its base
`__init__` instead of calling `super().__init__()`. Renames work on tokens (`tokenize`): NAME tokens,
dotted module paths in imports and code, f-string replacement fields, and strings that are a dotted name or
a type expression (forward-reference annotations, `"sglang.srt.managers.scheduler.Scheduler"`,
`getattr(x, "tree_cache")`); comments, docstrings and other strings are left alone. Edits are spans at token positions, every changed
file must parse, a new name must not occur anywhere in the tree before, and no old name may be left as an
identifier after. Targets are looked up in the tree (the 0.5.13 layout names some differently); a
refactor whose target a release lacks raises `RefactorError`.

Independent of the product's code, like placeholders.py.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

PACKAGE = ("sglang", "srt")  # dotted name of the tree root
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.?")
_TYPE_NODES = (ast.Expression, ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Constant,
               ast.BinOp, ast.BitOr, ast.Load)


class RefactorError(Exception):
    """The refactor cannot be made on this tree (target missing, name taken, result does not parse)."""


@dataclass
class Refactored:
    """What a refactor did, to map the unrefactored tree's sites and hooks onto the refactored one."""

    note: str
    paths: dict[str, str] = field(default_factory=dict)  # old -> new relative path (file or folder)
    names: dict[str, str] = field(default_factory=dict)  # renamed identifiers, old -> new
    # Forwards a fork transformation added outside every site: (relative path, line), each of which
    # `apply` must report (CI301) since no catalogued site guards it.
    forwards: list[tuple[str, int]] = field(default_factory=list)

    def path(self, rel: str) -> str:
        for old, new in self.paths.items():
            if rel == old or rel.startswith(old.rstrip("/") + "/"):
                return new + rel[len(old):]
        return rel

    def name(self, identifier: str) -> str:
        return self.names.get(identifier, identifier)


# --------------------------------------------------------------------------- token renamer


def _apply(text: str, edits: dict[tuple[int, int], tuple[tuple[int, int], str]]) -> str:
    """Replace token spans ((row, col) -> ((end row, end col), new text)); rows 1-based as tokenize's."""
    starts = [0]
    for line in io.StringIO(text).readlines():
        starts.append(starts[-1] + len(line))
    out, last = [], 0
    for (row, col), ((end_row, end_col), new) in sorted(edits.items()):
        begin, end = starts[row - 1] + col, starts[end_row - 1] + end_col
        out += [text[last:begin], new]
        last = end
    return "".join(out) + text[last:]


def _fstring_fields(body: str):
    """(start, end) of each top-level replacement field's text in an f-string body."""
    i, depth, start, quote = 0, 0, 0, None
    while i < len(body):
        ch = body[i]
        if quote:
            quote = None if ch == quote else quote
        elif depth and ch in "'\"":
            quote = ch
        elif ch == "{":
            if not depth and body.startswith("{{", i):
                i += 2
                continue
            depth += 1
            if depth == 1:
                start = i + 1
        elif ch == "}" and depth:
            depth -= 1
            if not depth:
                yield start, i
        i += 1


def _rename_string(token: str, names: dict, modules: dict) -> str:
    prefix = re.match(r"[A-Za-z]*", token).group().lower()
    body = token[len(prefix):]
    if "b" in prefix or body[:3] in ('"""', "'''"):
        return token  # bytes and docstrings are prose
    inner = body[1:-1]
    if "f" in prefix:
        spans = list(_fstring_fields(inner))
        for start, end in reversed(spans):
            inner = inner[:start] + rename_source(inner[start:end], names, modules, strict=False) + inner[end:]
        return token[: len(prefix) + 1] + inner + body[-1]
    if "\\" in inner or not inner.strip():
        return token
    trail = "." if inner.endswith(".") else ""  # module-prefix strings ("sglang.srt.managers.")
    expression = inner[: len(inner) - len(trail)]
    if not _DOTTED.fullmatch(inner):
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError:
            return token
        if not all(isinstance(node, _TYPE_NODES) for node in ast.walk(tree)):
            return token
    return token[: len(prefix) + 1] + rename_source(expression, names, modules, strict=False) + trail + body[-1]


def rename_source(text: str, names: dict[str, str], modules: dict[tuple, str] | None = None,
                  package: tuple = (), strict: bool = True) -> str:
    """`text` with identifiers renamed (`names`) and modules renamed (`modules`: dotted path tuple -> new
    last component) in import statements, `sglang.srt....` chains and dotted strings. `package` is the
    file's package, to resolve relative imports. Non-strict (inside a string) leaves untokenizable text."""
    modules = modules or {}
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                  if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)]
    except (tokenize.TokenError, SyntaxError):
        if strict:
            raise
        return text
    edits: dict = {}

    def edit(index: int, new: str) -> None:
        edits[tokens[index].start] = (tokens[index].end, new)

    def chain(j: int) -> tuple[list[int], int]:
        """Indices of the NAME tokens of a dotted name starting at j, and the index after it."""
        found = []
        while j < len(tokens) and tokens[j].type == tokenize.NAME and tokens[j].string not in ("import", "as"):
            found.append(j)
            if j + 1 < len(tokens) and tokens[j + 1].string == ".":
                j += 2
            else:
                return found, j + 1
        return found, j

    def rename_modules(parts: tuple, indices: list[int], base: int) -> None:
        for old, new in modules.items():
            at = len(old) - 1 - base
            if parts[: len(old)] == old and 0 <= at < len(indices):
                edit(indices[at], new)

    for i, tok in enumerate(tokens):
        previous = tokens[i - 1].string if i else ""
        if tok.type == tokenize.NAME:
            if tok.string in names:
                edit(i, names[tok.string])
            if modules and tok.string == PACKAGE[0] and previous != ".":
                indices, _ = chain(i)
                rename_modules(tuple(tokens[k].string for k in indices), indices, 0)
            if modules and tok.string == "from":
                j, level = i + 1, 0
                while tokens[j].string in (".", "..."):
                    level += len(tokens[j].string)
                    j += 1
                base = package[: len(package) - level + 1] if level else ()
                indices, j = chain(j)
                parts = base + tuple(tokens[k].string for k in indices)
                if level:
                    rename_modules(parts, indices, len(base))
                if j < len(tokens) and tokens[j].string == "import":  # `from pkg import module`
                    j += 1
                    while j < len(tokens) and tokens[j].type != tokenize.NEWLINE:
                        if tokens[j].type == tokenize.NAME and tokens[j - 1].string != "as":
                            for old, new in modules.items():
                                if parts + (tokens[j].string,) == old:
                                    aliased = j + 1 < len(tokens) and tokens[j + 1].string == "as"
                                    edit(j, new if aliased else f"{new} as {tokens[j].string}")
                        j += 1
        elif tok.type == tokenize.STRING:
            new = _rename_string(tok.string, names, modules)
            if new != tok.string:
                edit(i, new)
    return _apply(text, edits) if edits else text


# --------------------------------------------------------------------------- tree operations


def _py_files(root: Path):
    return sorted(root.rglob("*.py"))


def _read(path: Path) -> str:
    """The file's text, line endings as they are (a UTF-8 byte-order mark, which some releases have, kept)."""
    return path.read_bytes().decode("utf-8")


def _write(path: Path, text: str) -> None:
    try:
        ast.parse(text.removeprefix("\ufeff"))
    except SyntaxError as error:
        raise RefactorError(f"{path} does not parse after the refactor: {error}") from None
    path.write_bytes(text.encode("utf-8"))


def _package(root: Path, path: Path) -> tuple:
    return PACKAGE + path.parent.relative_to(root).parts


def _identifiers(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        for attr in ("id", "attr", "arg"):
            value = getattr(node, attr, None)
            if isinstance(value, str):
                found.add(value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
    return found


def _check_free(root: Path, names) -> None:
    if not names:
        return
    pattern = re.compile(rb"\b(" + b"|".join(re.escape(n.encode()) for n in names) + rb")\b")
    for path in _py_files(root):
        hit = pattern.search(path.read_bytes())
        if hit:
            raise RefactorError(f"{hit.group().decode()} already occurs in {path.relative_to(root)}")


def rename_tree(root: Path, names: dict[str, str] | None = None, moves: dict[str, str] | None = None) -> Refactored:
    """Rename identifiers everywhere and move modules or package folders (relative paths, same parent)."""
    names, moves = names or {}, moves or {}
    _check_free(root, names.values())
    modules = {}
    for old, new in moves.items():
        if not (root / old).exists():
            raise RefactorError(f"no {old}")
        if (root / new).exists() or Path(old).parent != Path(new).parent:
            raise RefactorError(f"cannot move {old} to {new}")
        modules[PACKAGE + tuple(old.removesuffix(".py").split("/"))] = Path(new).name.removesuffix(".py")
    needles = [n.encode() for n in names] + [m[-1].encode() for m in modules]
    touched = 0
    for path in _py_files(root):
        data = path.read_bytes()
        if not any(n in data for n in needles):
            continue
        text = data.decode("utf-8")
        new = rename_source(text, names, modules, _package(root, path))
        if new == text:
            continue
        touched += 1
        _write(path, new)
        left = _identifiers(ast.parse(new.removeprefix("\ufeff"))) & names.keys()
        if left:
            raise RefactorError(f"{path.relative_to(root)} still uses {sorted(left)}")
    if not touched:
        raise RefactorError(f"nothing to rename ({names or moves})")
    for old, new in moves.items():
        (root / old).rename(root / new)
    return Refactored(", ".join(f"{a} -> {b}" for a, b in {**names, **moves}.items()), dict(moves), dict(names))


def _defined(root: Path, kind: str, candidates: list[str]) -> str:
    """The first of `candidates` that the tree defines as a `class` or `def`."""
    for name in candidates:
        pattern = re.compile(rb"^\s*" + kind.encode() + rb"\s+" + name.encode() + rb"\b", re.M)
        if any(pattern.search(p.read_bytes()) for p in _py_files(root)):
            return name
    raise RefactorError(f"the tree defines no {kind} {' or '.join(candidates)}")


def _method(root: Path, classes: list[str], methods: list[str]) -> tuple[Path, ast.ClassDef, ast.FunctionDef]:
    """The file, class and method: the first class of `classes` the tree defines, its first of `methods`."""
    name = _defined(root, "class", classes)
    pattern = re.compile(rb"^class\s+" + name.encode() + rb"\b", re.M)
    for path in _py_files(root):
        if pattern.search(path.read_bytes()):
            cls = next(n for n in ast.parse(_read(path)).body if isinstance(n, ast.ClassDef) and n.name == name)
            for method in methods:
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef) and node.name == method:
                        return path, cls, node
    raise RefactorError(f"{name} has no method {' or '.join(methods)}")


def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode()[:byte_col].decode())


def rename_parameter(root: Path, classes: list[str], methods: list[str], old: str, new: str,
                     receivers: tuple[str, ...]) -> Refactored:
    """Rename a parameter in one method and its uses there, and the keyword in calls of that method on
    receivers whose name ends with one of `receivers` (its callers that pass it by keyword)."""
    path, cls, function = _method(root, classes, methods)
    if old not in [a.arg for a in function.args.args + function.args.kwonlyargs]:
        raise RefactorError(f"{cls.name}.{function.name} has no parameter {old}")
    if new in _identifiers(function):
        raise RefactorError(f"{new} is taken in {cls.name}.{function.name}")
    needle = re.compile(rb"\b" + old.encode() + rb"\s*=")
    for file in _py_files(root):
        data = file.read_bytes()
        if file != path and not (function.name.encode() in data and needle.search(data)):
            continue
        text = data.decode("utf-8")
        lines, edits = io.StringIO(text).readlines(), {}
        # In the method: its parameter and every read or write of it (keywords there name other callees' parameters).
        nodes = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == old
                 or isinstance(n, ast.arg) and n.arg == old] if file == path else []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == function.name:
                if ast.unparse(node.func.value).endswith(receivers):
                    nodes += [k for k in node.keywords if k.arg == old]
        for node in nodes:
            col = _char_col(lines[node.lineno - 1], node.col_offset)
            edits[(node.lineno, col)] = ((node.lineno, col + len(old)), new)
        if edits:
            _write(file, _apply(text, edits))
    return Refactored(f"{cls.name}.{function.name}({old} -> {new})")


def extract_method(root: Path, classes: list[str], methods: list[str], helper: str) -> Refactored:
    """Move a method's body (after its docstring) into a new private method it calls with every argument."""
    path, cls, function = _method(root, classes, methods)
    _check_free(root, [helper])
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(function)):
        raise RefactorError(f"{cls.name}.{function.name} is a generator or coroutine")
    lines = io.StringIO(_read(path)).readlines()
    body = function.body
    doc = body[0] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
    if body[0].lineno == function.lineno:
        raise RefactorError(f"{cls.name}.{function.name} is a one-liner")
    end = body[0].lineno - 1  # the signature's last line + 1; comments before the body move with it
    while end > function.lineno and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    header = lines[function.lineno - 1: end]
    moved_from = doc.end_lineno if doc else end
    indent = re.match(r"\s*", lines[body[-1].lineno - 1]).group()
    a = function.args
    passed = [x.arg for x in a.posonlyargs + a.args][1:]
    passed += [f"*{a.vararg.arg}"] if a.vararg else []
    passed += [f"{x.arg}={x.arg}" for x in a.kwonlyargs] + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
    call = [f"{indent}return self.{helper}({', '.join(passed)})\n"]
    renamed = [re.sub(rf"\bdef\s+{function.name}\b", f"def {helper}", header[0], count=1)] + header[1:]
    new = (lines[: moved_from] + call + ["\n"] + renamed + lines[moved_from: function.end_lineno]
           + lines[function.end_lineno:])
    _write(path, "".join(new))
    return Refactored(f"{cls.name}.{function.name} body -> {helper}")


def inline_super_init(root: Path, classes: list[str]) -> Refactored:
    """Replace `super().__init__()` in a class's `__init__` by what the base's `__init__` does (or drop it
    where the base has none): the worker then never calls its base initialiser."""
    path, cls, init = _method(root, classes, ["__init__"])
    calls = [s for s in init.body if isinstance(s, ast.Expr) and ast.unparse(s.value) == "super().__init__()"]
    if not calls:
        raise RefactorError(f"{cls.name}.__init__ calls no super().__init__()")
    base_name = ast.unparse(cls.bases[0]) if cls.bases else ""
    pattern = re.compile(rb"^class\s+" + base_name.encode() + rb"\b", re.M)
    inlined: list[str] = []
    for file in _py_files(root):
        if base_name and pattern.search(file.read_bytes()):
            source = _read(file)
            base = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == base_name)
            base_init = next((n for n in base.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if base_init is None:
                break
            if len(base_init.args.args) > 1 or base_init.args.vararg or base_init.args.kwarg:
                raise RefactorError(f"{base_name}.__init__ takes arguments")
            base_lines = io.StringIO(source).readlines()
            for stmt in base_init.body:
                if isinstance(stmt, ast.Expr) and (isinstance(stmt.value, ast.Constant)
                                                   or ast.unparse(stmt.value) == "super().__init__()"):
                    continue
                inlined += base_lines[stmt.lineno - 1: stmt.end_lineno]
            break
    lines = io.StringIO(_read(path)).readlines()
    stmt = calls[0]
    indent = lines[stmt.lineno - 1][: stmt.col_offset]
    base_indent = re.match(r"\s*", inlined[0]).group() if inlined else ""
    replacement = [indent + line[len(base_indent):] if line.strip() else line for line in inlined]
    if not replacement and len(init.body) == 1:
        replacement = [f"{indent}pass\n"]
    lines[stmt.lineno - 1: stmt.end_lineno] = replacement
    _write(path, "".join(lines))
    what = f"{len(replacement)} lines of {base_name}.__init__ inlined" if inlined else "the call dropped"
    return Refactored(f"{cls.name}.__init__ without super().__init__() ({what})")


def _class_file(root: Path, classes: list[str]) -> tuple[Path, ast.ClassDef]:
    name = _defined(root, "class", classes)
    pattern = re.compile(rb"^class\s+" + name.encode() + rb"\b", re.M)
    for path in _py_files(root):
        if pattern.search(path.read_bytes()):
            return path, next(n for n in ast.parse(_read(path)).body if isinstance(n, ast.ClassDef) and n.name == name)
    raise RefactorError(f"no class {name}")


def _added_forwards(root: Path, path: Path, marker: str) -> list[tuple[str, int]]:
    """(relative path, line) of the lines of `path` that hold `marker` (the forwards a fork added)."""
    rel = path.relative_to(root).as_posix()
    return [(rel, number) for number, line in enumerate(_read(path).splitlines(), 1) if marker in line]


def add_to_class(root: Path, classes: list[str], method: str, after_assign: tuple[str, str] | None = None,
                 marker: str = "") -> Refactored:
    """Append `method` (source at column 0, indented to the class body) to a class; with `after_assign`
    (attribute, new attribute), also assign the new attribute what `__init__` assigns the first one."""
    path, cls = _class_file(root, classes)
    lines = io.StringIO(_read(path)).readlines()
    body_indent = lines[cls.body[0].lineno - 1][: cls.body[0].col_offset]
    added = ["\n"] + [(body_indent + line if line.strip() else line) for line in io.StringIO(method).readlines()]
    insert_at = cls.end_lineno
    lines[insert_at:insert_at] = added
    if after_assign is not None:
        attribute, new = after_assign
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        assign = next((n for n in ast.walk(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                       and ast.unparse(n.targets[0]) == f"self.{attribute}"), None) if init else None
        if assign is None:
            raise RefactorError(f"{cls.name}.__init__ assigns no self.{attribute}")
        indent = lines[assign.lineno - 1][: assign.col_offset]
        lines.insert(assign.end_lineno, f"{indent}self.{new} = {ast.unparse(assign.value)}\n")
    _write(path, "".join(lines))
    return Refactored(f"{cls.name} + {method.split('(')[0].split()[-1]}", forwards=_added_forwards(root, path, marker))


def add_subclass(root: Path, classes: list[str], source: str, marker: str) -> Refactored:
    """Add a class (source at column 0, `{base}` the base's name) after the first of `classes` in its file."""
    path, cls = _class_file(root, classes)
    lines = io.StringIO(_read(path)).readlines()
    lines[cls.end_lineno:cls.end_lineno] = ["\n", "\n", *io.StringIO(source.format(base=cls.name)).readlines()]
    _write(path, "".join(lines))
    return Refactored(f"a subclass of {cls.name} with its own draft loop", forwards=_added_forwards(root, path, marker))


# A fork's code: each forward it adds sits outside every catalogued site.
LEGACY_DRAFT = '''def forward_draft_legacy(self, forward_batch):
    """An older EAGLE worker's draft step: the draft model runner's forward, called directly."""
    return self.draft_model_runner.forward(forward_batch)
'''
MULTI_LAYER_DRAFTER = '''class MultiLayerEagleDrafter({base}):
    """A multi-layer EAGLE draft worker: one draft forward per draft layer, in a loop of its own."""

    def draft(self, forward_batch):
        return self._draft_layers(forward_batch)

    def _draft_layers(self, forward_batch):
        outputs = []
        for layer in range(self.speculative_num_steps):
            outputs.append(self.draft_runner.forward(forward_batch))
        return outputs
'''
AUTOTUNE_DUMMY = '''def _autotune_dummy_forward(self, forward_batch):
    """An autotune dummy run: the model's forward on a dummy batch, outside the forward path."""
    return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
'''


# --------------------------------------------------------------------------- the refactors

GRAPH_RUNNER = ["DecodeCudaGraphRunner", "CudaGraphRunner"]  # 0.5.13: model_executor/cuda_graph_runner.py
CAPTURE = ["capture_one_shape", "capture_one_batch_size"]
DRAFT_WORKER = ["EagleDraftWorker"]


def _rename_defined(root: Path, kind: str, renames: list[tuple[list[str], str]]) -> Refactored:
    """Rename, for each (candidates, new name), the first candidate the tree defines; absent ones are skipped
    as long as one is there."""
    names = {}
    for candidates, new in renames:
        try:
            names[_defined(root, kind, candidates)] = new
        except RefactorError:
            continue
    if not names:
        raise RefactorError(f"none of {[c for c, _ in renames]} defined")
    return rename_tree(root, names)


DRAFT_METHODS = {"draft_forward": "run_draft_steps", "_draft_forward_idle": "_run_draft_steps_idle",
                 "_draft_extend_for_prefill": "_extend_draft_prefill",
                 "_draft_extend_for_decode": "_extend_draft_decode"}
GRAPH_SETUP = {"init_cuda_graphs": "prepare_graphs", "capture_cuda_graphs": "record_graphs",
               "finalize_cuda_graph_capture": "finish_graph_setup"}  # the functions that hold init-finished hooks

# name -> (what it does, the refactor: the `srt` folder of a copy -> what was done).
REFACTORS: dict[str, tuple[str, Callable[[Path], Refactored]]] = {
    "class-model-runner": ("rename the model-runner class", lambda r: _rename_defined(
        r, "class", [(["ModelRunner"], "ModelExecutor")])),
    "class-graph-runner": ("rename the decode graph-runner class", lambda r: _rename_defined(
        r, "class", [(GRAPH_RUNNER, "DecodeGraphExecutor")])),
    "class-draft-worker": ("rename the EAGLE draft-worker class", lambda r: _rename_defined(
        r, "class", [(DRAFT_WORKER, "EagleDrafter")])),
    "method-capture": ("rename the per-shape graph-capture method", lambda r: _rename_defined(
        r, "def", [(CAPTURE, "record_one_shape")])),
    "method-draft": ("rename the draft worker's draft-loop and draft-extend methods", lambda r: _rename_defined(
        r, "def", [([old], new) for old, new in DRAFT_METHODS.items()])),
    "method-graph-setup": ("rename the graph set-up functions", lambda r: _rename_defined(
        r, "def", [([old], new) for old, new in GRAPH_SETUP.items()])),
    "module-folder": ("rename the package folder model_executor/", lambda r: rename_tree(
        r, moves={"model_executor": "executor"})),
    "module-file": ("rename the EAGLE worker and scheduler modules", lambda r: rename_tree(
        r, moves={"speculative/eagle_worker_v2.py": "speculative/eagle_worker.py",
                  "managers/scheduler.py": "managers/batch_scheduler.py"})),
    "attr-draft-runner": ("rename the draft worker's runner attribute", lambda r: rename_tree(
        r, {"draft_runner": "draft_executor"})),
    "attr-tree-cache": ("rename the scheduler's radix-cache attribute", lambda r: rename_tree(
        r, {"tree_cache": "prefix_cache"})),
    "param-forward-batch": ("rename ModelRunner.forward's forward_batch parameter", lambda r: rename_parameter(
        r, ["ModelRunner"], ["forward"], "forward_batch", "batch", ("model_runner", "draft_runner"))),
    "extract-forward": ("move ModelRunner.forward's body into a helper", lambda r: extract_method(
        r, ["ModelRunner"], ["forward"], "_forward_one_batch")),
    "extract-draft": ("move the draft worker's draft body into a helper", lambda r: extract_method(
        r, DRAFT_WORKER, ["draft"], "_draft_impl")),
    "extract-capture": ("move the decode graph runner's capture body into a helper", lambda r: extract_method(
        r, GRAPH_RUNNER, CAPTURE, "_capture_shape_impl")),
    "no-super-init": ("a draft worker whose __init__ inlines its base's", lambda r: inline_super_init(
        r, DRAFT_WORKER)),
    "fork-legacy-draft": ("an older EAGLE worker's direct draft_model_runner.forward", lambda r: add_to_class(
        r, DRAFT_WORKER, LEGACY_DRAFT, ("draft_runner", "draft_model_runner"), "self.draft_model_runner.forward(")),
    "fork-multi-layer-draft": ("a multi-layer EAGLE draft worker with its own draft loop", lambda r: add_subclass(
        r, DRAFT_WORKER, MULTI_LAYER_DRAFTER, "self.draft_runner.forward(forward_batch))")),
    "fork-autotune-forward": ("an autotune dummy run of self.model.forward in the model runner", lambda r: add_to_class(
        r, ["ModelRunner"], AUTOTUNE_DUMMY, None, "self.model.forward(forward_batch.input_ids")),
}


def make_refactored(source: Path, dest: Path, refactor: str) -> Refactored:
    """Copy the Python files of `source` (a `sglang/srt` folder) to `dest` and refactor the copy."""
    shutil.copytree(source, dest, ignore=lambda d, names: [n for n in names
                                                          if not n.endswith(".py") and not Path(d, n).is_dir()])
    return REFACTORS[refactor][1](dest)
