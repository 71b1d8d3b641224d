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


_LINKS = frozenset({"for", "of", "in", "on", "to", "with", "by", "from", "the", "a", "an"})
_VERBS = frozenset({"get", "make", "create", "build", "new", "init", "load", "select", "pick", "choose"})


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def head_noun(identifier: str) -> str | None:
    """What an object is, by its name: the last word before a linking word, singular
    (`runners` -> runner, `cuda_graph_runner_for_draft_extend` -> runner)."""
    tokens = name_tokens(identifier)
    for index, token in enumerate(tokens):
        if token in _LINKS and index:
            tokens = tokens[:index]
            break
    return _singular(tokens[-1]) if tokens else None


def receiver_fits(receiver: str | None, class_name: str) -> bool:
    """Whether an object named `receiver` can, by naming convention, be an instance of `class_name`:
    their head nouns agree and every other word of the name is part of the class name
    (`cuda_graph_runner` fits `PrefillCudaGraphRunner` but not `EagerRunner`; `get_runner()` fits any
    runner; `state`, `graphs[key]` or `model` fit no runner). A name with no word to go by fits any."""
    if receiver is None:
        return True
    noun = head_noun(receiver)
    if noun is None:
        return True
    if noun != head_noun(class_name):
        return False
    compact = class_name.lower().replace("_", "")
    words = [t for t in name_tokens(receiver) if t not in _LINKS and not t.isdigit()]
    while words and words[0] in _VERBS:
        words = words[1:]
    return all(_singular(word) in compact for word in words if len(word) > 1)
