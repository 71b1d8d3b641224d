"""Before/after case files, one per case, as black keeps its own (tests/rewrite/cases/<group>/<name>.txt).

A case file holds, in this order: option lines `# key: value` (`path` is the file's place in the tree;
others, such as `note`, are for the test that reads the case), the marker `# input` and the source, then
for each command run in turn the marker `# output: <command>` and the exact text that command leaves.
Sections keep their bytes: no dedent, no stripping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CASES = Path(__file__).parent / "cases"
_OPTION = re.compile(r"# (\w+): (.+)\n")
_OUTPUT = re.compile(r"# output: (\w+)\n")


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    source: str
    outputs: list[tuple[str, str]]  # (command, the file's text after it), in the order they run
    options: dict[str, str]


def names(group: str) -> list[str]:
    return sorted(p.stem for p in (CASES / group).glob("*.txt"))


def load(group: str, name: str) -> Case:
    file = CASES / group / f"{name}.txt"
    lines = file.read_text().splitlines(keepends=True)
    options: dict[str, str] = {}
    sections: list[tuple[str, list[str]]] = []  # ("input" or a command, its lines)
    for number, line in enumerate(lines, 1):
        output = _OUTPUT.fullmatch(line)
        if line == "# input\n" and not sections:
            sections.append(("input", []))
        elif output and sections:
            sections.append((output.group(1), []))
        elif sections:
            sections[-1][1].append(line)
        elif option := _OPTION.fullmatch(line):
            options[option.group(1)] = option.group(2)
        else:
            raise ValueError(f"{file}:{number}: expected `# key: value` or `# input`, got {line!r}")
    if not sections or "path" not in options:
        raise ValueError(f"{file}: a case needs a `# path: ...` option and an `# input` section")
    (_, source), *outputs = sections
    return Case(name, options["path"], "".join(source), [(command, "".join(text)) for command, text in outputs],
                options)


def run(tree, case: Case) -> None:
    """Write the input, run each command in turn and compare the file with its output, byte for byte.
    The first command must also report no error and no finding."""
    tree.write({case.path: case.source.encode()})
    for step, (command, expected) in enumerate(case.outputs):
        result = tree.run(command)
        if step == 0:
            problems = [str(x) for x in (*result.errors, *result.findings)]
            assert result.errors == [] and result.findings == [], problems
        assert tree.read(case.path) == expected, f"{case.name}: after {command}"
