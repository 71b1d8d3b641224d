"""Before/after case files, one per case, as black keeps its own (tests/rewrite/cases/<group>/<name>.txt).

A case file holds, in this order: option lines `# key: value` (`path` is the file's place in the tree;
others, such as `note`, are for the test that reads the case), the marker `# input` and the source, then
for each command run in turn the marker `# output: <command>` and the exact text that command leaves.
A case whose tree holds several files gives each its own section, `# input: <path>` (the first is the
case's `path` and `source`), and no `path` option. Sections keep their bytes: no dedent, no stripping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CASES = Path(__file__).parent / "cases"
_OPTION = re.compile(r"# (\w+): (.+)\n")
_OUTPUT = re.compile(r"# output: (\w+)\n")
_INPUT = re.compile(r"# input: (\S+)\n")


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    source: str
    outputs: list[tuple[str, str]]  # (command, the file's text after it), in the order they run
    options: dict[str, str]
    files: dict[str, str]  # every input of the tree: path -> source (the case's own first)


def names(group: str) -> list[str]:
    return sorted(p.stem for p in (CASES / group).glob("*.txt"))


def load(group: str, name: str) -> Case:
    file = CASES / group / f"{name}.txt"
    lines = file.read_text().splitlines(keepends=True)
    options: dict[str, str] = {}
    inputs: list[tuple[str, list[str]]] = []  # (path, its lines)
    outputs: list[tuple[str, list[str]]] = []  # (command, its lines)
    for number, line in enumerate(lines, 1):
        output = _OUTPUT.fullmatch(line)
        named = _INPUT.fullmatch(line)
        if line == "# input\n" and not inputs and "path" in options:
            inputs.append((options["path"], []))
        elif named and not outputs and "path" not in options:
            inputs.append((named.group(1), []))
        elif output and inputs:
            outputs.append((output.group(1), []))
        elif inputs:
            (outputs or inputs)[-1][1].append(line)
        elif option := _OPTION.fullmatch(line):
            options[option.group(1)] = option.group(2)
        else:
            raise ValueError(f"{file}:{number}: expected `# key: value` or `# input`, got {line!r}")
    if not inputs:
        raise ValueError(f"{file}: a case needs a `# path: ...` option and an `# input` section, "
                         "or `# input: <path>` sections")
    files = {path: "".join(text) for path, text in inputs}
    path = inputs[0][0]
    return Case(name, path, files[path], [(command, "".join(text)) for command, text in outputs], options, files)


def files(group: str, name: str) -> dict[str, bytes]:
    """The tree a case holds, as `Tree.write` takes it (bytes: written as they are)."""
    return {path: text.encode() for path, text in load(group, name).files.items()}


def run(tree, case: Case) -> None:
    """Write the input, run each command in turn and compare the file with its output, byte for byte.
    The first command must also report no error and no finding."""
    tree.write({path: text.encode() for path, text in case.files.items()})
    for step, (command, expected) in enumerate(case.outputs):
        result = tree.run(command)
        if step == 0:
            problems = [str(x) for x in (*result.errors, *result.findings)]
            assert result.errors == [] and result.findings == [], problems
        assert tree.read(case.path) == expected, f"{case.name}: after {command}"
