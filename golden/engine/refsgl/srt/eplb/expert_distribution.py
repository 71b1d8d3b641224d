"""Per-forward-pass recorder, at the hook point where sglang records MoE expert routing.

refsgl has no experts; the recorder keeps the per-mode pass and token counts that the
same hook point reports, which the engine's stats read.
"""

from __future__ import annotations

import contextlib
from collections import Counter


class ExpertDistributionRecorder:
    def __init__(self):
        self.passes: Counter = Counter()
        self.tokens: Counter = Counter()
        self.last_forward_pass_id = -1

    @contextlib.contextmanager
    def with_forward_pass(self, forward_pass_id: int, forward_batch):
        outputs: dict = {"forward_pass_id": forward_pass_id}
        yield outputs
        mode = forward_batch.forward_mode.name.lower()
        self.passes[mode] += 1
        self.tokens[mode] += int(forward_batch.input_ids.shape[0])
        self.last_forward_pass_id = forward_pass_id


_RECORDER = ExpertDistributionRecorder()


def get_global_expert_distribution_recorder() -> ExpertDistributionRecorder:
    return _RECORDER
