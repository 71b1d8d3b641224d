"""The structured sink: every violation read, one JSON object a line, appended to a file a tool can follow.

Not bounded like the log: it holds every record the device ring kept, and a `{"dropped": N, "step": S}`
object where records went past the ring's capacity before they were read. Each rank writes its own file
(`{rank}` in the path is replaced by the process's rank, else `.rankN` is added when there is more than one).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable


class Sink:
    def __init__(self, path: str, rank: int = 0, ranks: int = 1) -> None:
        if "{rank}" in path:
            path = path.replace("{rank}", str(rank))
        elif ranks > 1:
            path = f"{path}.rank{rank}"
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # a line at a time: a reader sees whole objects

    def write(self, violations: Iterable, dropped: int = 0, step: int = 0) -> None:
        lines = [json.dumps(v.as_dict(), separators=(",", ":")) for v in violations]
        if dropped:
            lines.append(json.dumps({"dropped": dropped, "step": step}))
        if lines:
            self._file.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self._file.close()


def open_sink(path: str, process_group: Any = None) -> Sink | None:
    """The sink the settings name, for this process's rank of `process_group`; None when off."""
    if not path:
        return None
    rank, ranks = 0, 1
    if process_group is not None:
        import torch.distributed as dist

        rank, ranks = dist.get_rank(process_group), dist.get_world_size(process_group)
    return Sink(path, rank, ranks)
