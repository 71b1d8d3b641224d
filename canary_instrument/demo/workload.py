"""A seeded request stream that keeps an engine busy with prefix sharing, chunked prefill and eviction.

Prompts start with one of a few shared "system prompts" (so the prefix cache hits), then
a random suffix; some prompts are longer than a prefill chunk; some are follow-up turns
that extend a finished conversation (prompt + answer + new turn), which is what keeps
prefix hits alive under a sliding window. The stream keeps a fixed number of requests
in flight, so finished requests are replaced and the cache fills up.
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
    follow_up_probability: float = 0.35
    follow_up_len: tuple[int, int] = (2, 16)


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

    def _tokens(self, length_range: tuple[int, int]) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(*length_range))]

    def _new_prompt(self, max_new_tokens: int) -> list[int]:
        finished = self.engine.scheduler.finished
        if finished and self.rng.random() < self.shape.follow_up_probability:
            prompt = self.rng.choice(finished[-16:]).all_token_ids + self._tokens(self.shape.follow_up_len)
            if len(prompt) + max_new_tokens <= self.limit:
                return prompt
        return self.rng.choice(self.system_prompts) + self._tokens(self.shape.suffix_len)

    @property
    def limit(self) -> int:
        """Longest prompt + output the engine accepts (it keeps room for one verify window)."""
        args = self.engine.server_args
        return args.max_context_len - (args.speculative_num_steps + 1 if args.is_eagle else 0) - 1

    def top_up(self):
        scheduler = self.engine.scheduler
        in_flight = len(scheduler.waiting) + len(scheduler.running) + (scheduler.chunked_req is not None)
        for _ in range(self.shape.concurrency - in_flight):
            max_new_tokens = self.rng.randint(*self.shape.max_new_tokens)
            self.engine.add_request(self._new_prompt(max_new_tokens), max_new_tokens)

    def step(self):
        self.top_up()
        return self.engine.step()
