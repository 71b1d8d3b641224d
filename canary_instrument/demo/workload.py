"""A seeded request stream that keeps an engine busy with prefix sharing, chunked prefill and eviction.

Prompts start with one of a few shared "system prompts" (so the prefix cache hits), then
a random suffix; some prompts are longer than a prefill chunk. The stream keeps a fixed
number of requests in flight, so finished requests are replaced and the cache fills up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadShape:
    concurrency: int = 6
    num_system_prompts: int = 3
    system_prompt_len: tuple[int, int] = (12, 40)
    suffix_len: tuple[int, int] = (2, 48)
    max_new_tokens: tuple[int, int] = (6, 28)


class Workload:
    def __init__(self, engine, rng: random.Random, shape: WorkloadShape = WorkloadShape()):
        self.engine = engine
        self.rng = rng
        self.shape = shape
        vocab = engine.server_args.vocab_size
        self.vocab = vocab
        self.system_prompts = [
            [rng.randrange(vocab) for _ in range(rng.randint(*shape.system_prompt_len))]
            for _ in range(shape.num_system_prompts)
        ]

    def _new_prompt(self) -> list[int]:
        prefix = self.rng.choice(self.system_prompts)
        suffix = [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(*self.shape.suffix_len))]
        return prefix + suffix

    def top_up(self):
        scheduler = self.engine.scheduler
        in_flight = len(scheduler.waiting) + len(scheduler.running) + (scheduler.chunked_req is not None)
        for _ in range(self.shape.concurrency - in_flight):
            self.engine.add_request(self._new_prompt(), self.rng.randint(*self.shape.max_new_tokens))

    def step(self):
        self.top_up()
        return self.engine.step()
