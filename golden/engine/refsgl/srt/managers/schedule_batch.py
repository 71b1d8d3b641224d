"""Requests and the scheduler's batch, and how a batch becomes a ForwardBatch for a model runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


@dataclass
class Req:
    rid: int
    origin_input_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: Optional[int] = None
    last_node: object = None  # prefix-cache node this request locked
    cached_len: int = 0  # positions [0, cached_len) have KV in the cache
    prefix_len: int = 0  # of the current step
    extend_len: int = 0  # new positions written by the current step
    is_last_chunk: bool = True
    swa_evicted_seqlen: int = 0  # positions below this released their SWA window hold
    finished: bool = False

    @property
    def all_token_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


class ScheduleBatch:
    """One scheduler step's requests. For decode, `seq_lens` holds the cached lengths."""

    def __init__(self, reqs: list[Req], forward_mode: ForwardMode, device: str, out_cache_loc: Optional[torch.Tensor]):
        self.reqs = reqs
        self.forward_mode = forward_mode
        self.device = device
        self.out_cache_loc = out_cache_loc
        self.req_pool_indices = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64, device=device)
        self.prefix_lens = [r.prefix_len for r in reqs]
        self.extend_lens = [r.extend_len for r in reqs]
        self.seq_lens = torch.tensor([r.cached_len for r in reqs], dtype=torch.int64, device=device)

    def batch_size(self) -> int:
        return len(self.reqs)

    def _fill_ids(self) -> list[int]:
        ids = []
        for r in self.reqs:
            ids.extend(r.all_token_ids[r.prefix_len : r.prefix_len + r.extend_len])
        return ids

    def rotated_input_ids(self, next_token_ids: torch.Tensor) -> torch.Tensor:
        """EAGLE draft inputs: position p gets token p + 1 (the sampled token closes a last chunk)."""
        ids = []
        for r, nxt in zip(self.reqs, next_token_ids.tolist()):
            tokens = r.all_token_ids + ([nxt] if r.is_last_chunk else [])
            ids.extend(tokens[r.prefix_len + 1 : r.prefix_len + r.extend_len + 1])
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def to_forward_batch(
        self,
        runner,
        mode: Optional[ForwardMode] = None,
        input_ids: Optional[torch.Tensor] = None,
        spec_info=None,
    ) -> ForwardBatch:
        """Extend-like (ragged) or plain decode batch over this step's positions."""
        mode = mode or self.forward_mode
        positions = torch.cat(
            [torch.arange(p, p + n, dtype=torch.int64) for p, n in zip(self.prefix_lens, self.extend_lens)]
        ).to(self.device)
        if input_ids is None:
            input_ids = torch.tensor(self._fill_ids(), dtype=torch.int64, device=self.device)
        seq_lens = [p + n for p, n in zip(self.prefix_lens, self.extend_lens)]
        extend = mode.is_extend()
        return ForwardBatch(
            forward_mode=mode,
            batch_size=self.batch_size(),
            input_ids=input_ids,
            req_pool_indices=self.req_pool_indices,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=self.device),
            positions=positions,
            out_cache_loc=self.out_cache_loc,
            extend_prefix_lens=torch.tensor(self.prefix_lens, device=self.device) if extend else None,
            extend_seq_lens=torch.tensor(self.extend_lens, device=self.device) if extend else None,
            extend_prefix_lens_cpu=list(self.prefix_lens) if extend else None,
            extend_seq_lens_cpu=list(self.extend_lens) if extend else None,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            spec_info=spec_info,
        )

    def to_fixed_length_forward_batch(
        self,
        runner,
        mode: ForwardMode,
        token_ids: torch.Tensor,
        spec_info=None,
    ) -> ForwardBatch:
        """Every request writes positions [n, n + T) after its n cached ones (verify, draft-extend)."""
        bs, num_tokens_per_req = token_ids.shape
        offsets = torch.arange(num_tokens_per_req, device=self.device)
        positions = (self.seq_lens[:, None] + offsets[None, :]).reshape(-1)
        rows = self.req_pool_indices.repeat_interleave(num_tokens_per_req)
        out_cache_loc = runner.req_to_token_pool.req_to_token[rows, positions].long()
        # TARGET_VERIFY reports the prefix as seq_lens (sglang); DRAFT_EXTEND the length after it.
        seq_lens = self.seq_lens if mode.is_target_verify() else self.seq_lens + num_tokens_per_req
        prefix_cpu = self.seq_lens.tolist()
        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=token_ids.reshape(-1).contiguous(),
            req_pool_indices=self.req_pool_indices,
            seq_lens=seq_lens,
            positions=positions,
            out_cache_loc=out_cache_loc,
            extend_prefix_lens=self.seq_lens.clone(),
            extend_seq_lens=torch.full((bs,), num_tokens_per_req, dtype=torch.int64, device=self.device),
            extend_prefix_lens_cpu=prefix_cpu,
            extend_seq_lens_cpu=[num_tokens_per_req] * bs,
            num_tokens_per_req=num_tokens_per_req,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            spec_info=spec_info,
        )
