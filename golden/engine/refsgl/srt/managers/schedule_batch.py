"""Requests and the scheduler's batch, and how a batch becomes a ForwardBatch for a model runner.

Host work per batch is O(batch) plain Python and a fixed number of torch calls: the per-request
numbers go into one host tensor that reaches the device in one copy, and the tensors the batch
hands out are views of it.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field
from typing import Optional

import torch

from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


@dataclass(eq=False)  # identity semantics: the scheduler's membership tests compare objects, not field tuples
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
    kv_allocated_len: int = 0  # positions [0, kv_allocated_len) of its row hold its slots (EAGLE: its last window)
    finished: bool = False

    @property
    def all_token_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.origin_input_ids[-1]

    def token_ids(self, start: int, end: int) -> list[int]:
        """`all_token_ids[start:end]` (0 <= start <= end) without building the whole sequence."""
        prompt = self.origin_input_ids
        n = len(prompt)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return prompt[start:end]
        return prompt[start:] + self.output_ids[: end - n]


def _int64_tensors(device, *columns: list[int]) -> tuple[torch.Tensor, ...]:
    """Each list of ints as an int64 tensor on `device`: one host tensor, one copy, views of it.

    Every view starts 16-byte aligned, as a tensor of its own would (Triton specialises kernels on it).
    """
    flat, sizes = [], []
    for column in columns:
        flat += column
        if len(column) % 2:
            flat.append(0)
        sizes.append(len(column))
    views = torch.tensor(flat, dtype=torch.int64).to(device).split([n + n % 2 for n in sizes])
    return tuple(view[:n] if n % 2 else view for view, n in zip(views, sizes))


class ScheduleBatch:
    """One scheduler step's requests. For decode, `seq_lens` holds the cached lengths."""

    def __init__(self, reqs: list[Req], forward_mode: ForwardMode, device: str, out_cache_loc: Optional[torch.Tensor]):
        self.reqs = reqs
        self.forward_mode = forward_mode
        self.device = device
        self.out_cache_loc = out_cache_loc
        self.prefix_lens = [r.prefix_len for r in reqs]
        self.extend_lens = [r.extend_len for r in reqs]
        self.cached_lens = [r.cached_len for r in reqs]  # host copy of seq_lens
        self.req_pool_indices, self.seq_lens = _int64_tensors(
            device, [r.req_pool_idx for r in reqs], self.cached_lens
        )

    def batch_size(self) -> int:
        return len(self.reqs)

    def _fill_ids(self) -> list[int]:
        ids = []
        for r in self.reqs:
            ids.extend(r.token_ids(r.prefix_len, r.prefix_len + r.extend_len))
        return ids

    def rotated_input_ids(self, next_token_ids: torch.Tensor) -> torch.Tensor:
        """EAGLE draft inputs: position p gets token p + 1 (the sampled token closes a last chunk)."""
        ids = []
        for r, nxt in zip(self.reqs, next_token_ids.tolist()):
            # all_token_ids (+ the sampled token) [start, end), without building the sequence.
            start, end, seq_len = r.prefix_len + 1, r.prefix_len + r.extend_len + 1, r.seq_len
            ids.extend(r.token_ids(start, max(start, min(end, seq_len))))
            if r.is_last_chunk and start <= seq_len < end:
                ids.append(nxt)
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
        prefix_lens, extend_lens = self.prefix_lens, self.extend_lens
        seq_lens = list(map(operator.add, prefix_lens, extend_lens))
        if extend_lens.count(1) == len(extend_lens):  # one new position per request (decode)
            positions = prefix_lens
        else:
            positions = list(itertools.chain.from_iterable(map(range, prefix_lens, seq_lens)))
        extend = mode.is_extend()
        columns = [positions, seq_lens]
        if input_ids is None:
            columns.append(self._fill_ids())
        if extend:
            columns += [prefix_lens, extend_lens]
        tensors = _int64_tensors(self.device, *columns)
        positions_t, seq_lens_t = tensors[:2]
        if input_ids is None:
            input_ids = tensors[2]
        return ForwardBatch(
            forward_mode=mode,
            batch_size=self.batch_size(),
            input_ids=input_ids,
            req_pool_indices=self.req_pool_indices,
            seq_lens=seq_lens_t,
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
            positions=positions_t,
            out_cache_loc=self.out_cache_loc,
            extend_prefix_lens=tensors[-2] if extend else None,
            extend_seq_lens=tensors[-1] if extend else None,
            extend_prefix_lens_cpu=list(prefix_lens) if extend else None,
            extend_seq_lens_cpu=list(extend_lens) if extend else None,
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
        prefix_cpu = list(self.cached_lens)
        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=token_ids.reshape(-1).contiguous(),
            req_pool_indices=self.req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=torch.tensor(prefix_cpu if mode.is_target_verify() else
                                      [n + num_tokens_per_req for n in prefix_cpu], dtype=torch.int64),
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
