"""EAGLE speculative decoding (topk = 1 chains, greedy acceptance), shaped like sglang's eagle_worker_v2.

One decode step: the draft model proposes `speculative_num_steps` tokens (one from the
previous draft-extend, then one per multi-step draft forward), the target verifies them
in one forward, and a draft-extend over the verified positions refreshes the draft's KV
and proposes the next chain's first token. The draft runner's KV slot of position p holds
the draft's view of token p + 1 (its input ids are rotated by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from refsgl.srt.configs.model_config import ModelConfig
from refsgl.srt.debug_hooks import DebugHooks
from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from refsgl.srt.model_executor.forward_context import forward_context
from refsgl.srt.model_executor.model_runner import ModelRunner
from refsgl.srt.server_args import ServerArgs
from refsgl.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from refsgl.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner
from refsgl.srt.speculative.spec_info import EagleDraftInput, EagleVerifyOutput

if TYPE_CHECKING:  # pragma: no cover
    from refsgl.srt.managers.schedule_batch import ScheduleBatch


@dataclass
class GenerationBatchResult:
    # Per request, the tokens this step commits (1 for prefill, accept_len + 1 for decode).
    next_token_ids: list[list[int]]
    verify_output: Optional[EagleVerifyOutput] = None


class EAGLEWorkerV2:
    """Drives the draft runner around the target runner."""

    def __init__(self, server_args: ServerArgs, target_worker: ModelRunner, hooks: Optional[DebugHooks] = None):
        self.server_args = server_args
        self.target_worker = target_worker
        self.hooks = hooks or DebugHooks()
        self.device = target_worker.device
        self.topk = 1
        self.speculative_num_steps = server_args.speculative_num_steps
        self.speculative_num_draft_tokens = self.speculative_num_steps + 1

        self.draft_runner = ModelRunner(
            ModelConfig.for_draft(target_worker.model_config),
            server_args,
            req_to_token_pool=target_worker.req_to_token_pool,
            token_to_kv_pool_allocator=target_worker.token_to_kv_pool_allocator,
            is_draft_worker=True,
        )
        # EAGLE heads reuse the target's embedding and LM head.
        self.draft_runner.model.set_embed_and_head(*target_worker.model.get_embed_and_head())

        # Per request-pool row (padding row 0 included): the next chain's first draft token and the
        # draft hidden state it came from.
        num_rows = target_worker.req_to_token_pool.req_to_token.shape[0]
        hidden_size = target_worker.model_config.hidden_size
        self.next_draft_token = torch.zeros((num_rows,), dtype=torch.int64, device=self.device)
        self.next_draft_hidden = torch.zeros((num_rows, hidden_size), dtype=target_worker.dtype, device=self.device)

        self.cuda_graph_runner: Optional[EAGLEDraftCudaGraphRunner] = None
        self.cuda_graph_runner_for_draft_extend: Optional[EAGLEDraftExtendCudaGraphRunner] = None
        self.init_cuda_graphs()

    def init_cuda_graphs(self):
        """Capture the multi-step draft graphs and the draft-extend graphs used after each verify (CUDA only)."""
        use_graphs = not self.server_args.disable_cuda_graph and torch.device(self.device).type == "cuda"
        if use_graphs:
            self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self)
            self.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(self)

    # ------------------------------------------------------------------ entry point

    def forward_batch_generation(
        self,
        batch: "ScheduleBatch",
        on_verify_complete: Optional[Callable[[EagleVerifyOutput], None]] = None,
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            forward_batch = batch.to_forward_batch(self.target_worker)
            self.hooks.fire("batch_built", forward_batch=forward_batch, runner=self.target_worker)
            logits_output = self.target_worker.forward(forward_batch).logits_output
            next_token_ids = self.target_worker.sample(logits_output, forward_batch)
            self._draft_extend_for_prefill(batch, logits_output.hidden_states, next_token_ids)
            sampled = next_token_ids.tolist()
            return GenerationBatchResult(
                next_token_ids=[[tok] if req.is_last_chunk else [] for req, tok in zip(batch.reqs, sampled)]
            )

        draft_tokens = self.draft(batch)
        verify_output = self.verify(batch, draft_tokens)
        if on_verify_complete is not None:
            on_verify_complete(verify_output)
        self._draft_extend_for_decode(batch, verify_output)
        return GenerationBatchResult(next_token_ids=verify_output.committed_tokens, verify_output=verify_output)

    # ------------------------------------------------------------------ draft

    def _prepare_draft_batch(self, batch: "ScheduleBatch") -> ForwardBatch:
        """Decode-mode batch for the draft chain: step i writes position seq_lens - 1 + i."""
        req_pool_indices = batch.req_pool_indices
        seq_lens = batch.seq_lens + 1  # the last verified token sits at position seq_lens - 1
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=batch.batch_size(),
            input_ids=self.next_draft_token[req_pool_indices],
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            positions=seq_lens - 1,
            out_cache_loc=self.draft_runner.req_to_token_pool.req_to_token[req_pool_indices, seq_lens - 1].long(),
            req_to_token_pool=self.draft_runner.req_to_token_pool,
            token_to_kv_pool=self.draft_runner.token_to_kv_pool,
            attn_backend=self.draft_runner.attn_backend,
            spec_info=EagleDraftInput(
                hidden_states=self.next_draft_hidden[req_pool_indices],
                topk_index=self.next_draft_token[req_pool_indices].unsqueeze(1),
            ),
        )

    def draft(self, batch: "ScheduleBatch") -> torch.Tensor:
        forward_batch = self._prepare_draft_batch(batch)
        can_cuda_graph = self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch)
        if can_cuda_graph:
            parent_list, top_scores_index, draft_tokens = (
                self.cuda_graph_runner.replay(forward_batch)
            )
        else:
            parent_list, top_scores_index, draft_tokens = self.draft_forward(forward_batch)
        return draft_tokens

    def draft_forward(self, forward_batch: ForwardBatch):
        """Run the draft chain: each step feeds back its own best token and hidden state."""
        spec_info = forward_batch.spec_info
        topk_index = spec_info.topk_index
        hidden_states = spec_info.hidden_states
        base_positions = forward_batch.seq_lens - 1
        req_to_token = self.draft_runner.req_to_token_pool.req_to_token
        token_list = []
        for i in range(self.speculative_num_steps):
            input_ids = topk_index.flatten()
            token_list.append(input_ids)
            if i == self.speculative_num_steps - 1:
                break
            forward_batch.input_ids = input_ids
            forward_batch.positions = base_positions + i
            forward_batch.out_cache_loc = req_to_token[forward_batch.req_pool_indices, forward_batch.positions].long()
            spec_info.hidden_states = hidden_states
            with forward_context(self.draft_runner.attn_backend, forward_batch, step=i):
                logits_output = self.draft_runner.model.forward(
                    forward_batch.input_ids, forward_batch.positions, forward_batch
                )
            topk_index = torch.argmax(logits_output.next_token_logits, dim=-1, keepdim=True)
            hidden_states = logits_output.hidden_states

        draft_tokens = torch.stack(token_list, dim=1)
        # topk = 1: every draft token's parent is the previous one in the chain.
        steps = torch.arange(self.speculative_num_steps, device=draft_tokens.device)
        parent_list = (steps - 1).expand(forward_batch.batch_size, -1)
        top_scores_index = steps.expand(forward_batch.batch_size, -1)
        return parent_list, top_scores_index, draft_tokens

    # ------------------------------------------------------------------ verify

    def verify(self, batch: "ScheduleBatch", draft_tokens: torch.Tensor) -> EagleVerifyOutput:
        """Target forward over [last verified token, draft chain]; greedy acceptance."""
        bs = batch.batch_size()
        num_draft = self.speculative_num_draft_tokens
        last_tokens = torch.tensor([req.last_token_id for req in batch.reqs], device=self.device)
        verify_ids = torch.cat([last_tokens.unsqueeze(1), draft_tokens], dim=1)
        forward_batch = batch.to_fixed_length_forward_batch(
            self.target_worker, ForwardMode.TARGET_VERIFY, verify_ids
        )
        self.hooks.fire("batch_built", forward_batch=forward_batch, runner=self.target_worker)
        logits_output = self.target_worker.forward(forward_batch).logits_output
        target_predict = torch.argmax(logits_output.next_token_logits, dim=-1).view(bs, num_draft)
        matches = (draft_tokens == target_predict[:, :-1]).int()
        accept_lens = torch.cumprod(matches, dim=1).sum(dim=1)
        committed = []
        for row, (accept_len, drafts, predicts) in enumerate(
            zip(accept_lens.tolist(), draft_tokens.tolist(), target_predict.tolist())
        ):
            committed.append(drafts[:accept_len] + [predicts[accept_len]])
        return EagleVerifyOutput(
            accept_lens=accept_lens,
            committed_tokens=committed,
            target_predict=target_predict,
            hidden_states=logits_output.hidden_states,
        )

    # ------------------------------------------------------------------ draft extend

    def _draft_extend_for_prefill(
        self, batch: "ScheduleBatch", target_hidden_states: torch.Tensor, next_token_ids: torch.Tensor
    ):
        """Fill the draft KV over the prefilled positions with input ids rotated by one."""
        rotated_ids = batch.rotated_input_ids(next_token_ids)
        forward_batch = batch.to_forward_batch(
            self.draft_runner,
            mode=ForwardMode.DRAFT_EXTEND,
            input_ids=rotated_ids,
            spec_info=EagleDraftInput(hidden_states=target_hidden_states),
        )
        self.hooks.fire("draft_extend_batch", forward_batch=forward_batch, runner=self.draft_runner, batch=batch)
        logits_output = self.draft_runner.forward(forward_batch).logits_output
        # Logits come one per request (its last token); hidden states one per token.
        last_index = torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1
        keep = torch.tensor([req.is_last_chunk for req in batch.reqs], device=self.device)
        self._store_next_draft(
            batch.req_pool_indices[keep],
            logits_output.next_token_logits[keep],
            logits_output.hidden_states[last_index[keep]],
        )

    def _draft_extend_for_decode(self, batch: "ScheduleBatch", verify_output: EagleVerifyOutput):
        """Draft-extend over all verified positions; the accepted prefix seeds the next chain."""
        bs = batch.batch_size()
        num_draft = self.speculative_num_draft_tokens
        forward_batch = batch.to_fixed_length_forward_batch(
            self.draft_runner,
            ForwardMode.DRAFT_EXTEND,
            verify_output.target_predict,
            spec_info=EagleDraftInput(hidden_states=verify_output.hidden_states),
        )
        self.hooks.fire("draft_extend_batch", forward_batch=forward_batch, runner=self.draft_runner, batch=batch)
        can_cuda_graph = (
            self.cuda_graph_runner_for_draft_extend is not None
            and self.cuda_graph_runner_for_draft_extend.can_run(forward_batch)
        )
        if can_cuda_graph:
            logits_output = self.cuda_graph_runner_for_draft_extend.replay(forward_batch)
        else:
            logits_output = self.draft_runner.forward(forward_batch).logits_output
        accept_index = torch.arange(bs, device=self.device) * num_draft + verify_output.accept_lens
        self._store_next_draft(
            batch.req_pool_indices,
            logits_output.next_token_logits[accept_index],
            logits_output.hidden_states[accept_index],
        )

    def _store_next_draft(self, rows: torch.Tensor, logits: torch.Tensor, hidden_states: torch.Tensor):
        self.next_draft_token[rows] = torch.argmax(logits, dim=-1)
        self.next_draft_hidden[rows] = hidden_states
