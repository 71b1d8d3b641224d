"""What a name says about the object it holds, by the naming convention engine code follows.

CI301 uses it where nothing types a receiver: `self.cuda_graph_runner.execute(...)` can reach
`EagerRunner.execute` (a runner), `state.capture(...)` cannot reach `CPUGraphRunner.capture`, nor
`self.graphs[key].replay()` a graph runner's `replay`.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|\b|_)|[A-Z]?[a-z]+|[A-Z]+|\d+")


def name_tokens(identifier: str) -> list[str]:
    """`cuda_graph_runner` -> cuda, graph, runner; `EAGLEDraftCudaGraphRunner` -> eagle, draft, cuda, graph, runner."""
    return [w.lower() for part in identifier.split("_") for w in _WORD.findall(part)]


def head_noun(identifier: str) -> str | None:
    """The last word of a name, singular: what the object is (`self.runners[i]` -> runner)."""
    tokens = name_tokens(identifier)
    if not tokens:
        return None
    last = tokens[-1]
    return last[:-1] if len(last) > 3 and last.endswith("s") and not last.endswith("ss") else last


def receiver_fits(receiver: str | None, class_name: str) -> bool:
    """Whether an object named `receiver` can, by naming convention, be an instance of `class_name`:
    both name the same kind of thing, their head nouns agree (`cuda_graph_runner` and
    `get_runner()` fit `EagerRunner`; `state`, `graphs[key]` or `model` fit no runner)."""
    if receiver is None:
        return True
    noun = head_noun(receiver)
    return noun is not None and noun == head_noun(class_name)
