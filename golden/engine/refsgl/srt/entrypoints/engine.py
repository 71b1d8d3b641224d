"""Engine: builds the model runner, the optional EAGLE worker and the scheduler, and runs steps."""

from __future__ import annotations

from typing import Optional

from refsgl.srt.configs.model_config import ModelConfig
from refsgl.srt.debug_hooks import DebugHooks
from refsgl.srt.managers.scheduler import Scheduler
from refsgl.srt.model_executor.model_runner import ModelRunner
from refsgl.srt.server_args import ServerArgs
from refsgl.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2


class Engine:
    def __init__(self, server_args: Optional[ServerArgs] = None, **kwargs):
        self.server_args = server_args or ServerArgs(**kwargs)
        self.hooks = DebugHooks()
        self.model_runner = ModelRunner(ModelConfig.from_server_args(self.server_args), self.server_args)
        self.spec_worker = (
            EAGLEWorkerV2(self.server_args, self.model_runner, hooks=self.hooks) if self.server_args.is_eagle else None
        )
        self.scheduler = Scheduler(self.server_args, self.model_runner, self.spec_worker, hooks=self.hooks)

    @property
    def model_runners(self) -> list[ModelRunner]:
        runners = [self.model_runner]
        if self.spec_worker is not None:
            runners.append(self.spec_worker.draft_runner)
        return runners

    def add_request(self, input_ids: list[int], max_new_tokens: int):
        return self.scheduler.add_request(input_ids, max_new_tokens)

    def step(self):
        return self.scheduler.step()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, max_steps: int = 100_000) -> list[list[int]]:
        reqs = [self.add_request(p, max_new_tokens) for p in prompts]
        for _ in range(max_steps):
            if self.scheduler.is_idle():
                break
            self.step()
        else:
            raise RuntimeError(f"generate did not finish within {max_steps} steps")
        return [r.output_ids for r in reqs]
