"""Scheduler: admits requests against KV memory, mixes prefill, chunked prefill and decode,
shares prefixes through the radix cache (with HiCache, through its host tier too), evicts
out-of-window SWA slots, and drives either the target model runner directly or the EAGLE worker.

A step is prefill-first, as in sglang: if waiting requests (or an unfinished chunk) fit,
run an extend batch (with the running requests riding along as one-token extends when
`enable_mixed_chunk` is set); otherwise decode every running request.

A decode step's host work is O(batch) plain Python and a fixed number of torch calls: one slot
allocation, one `req_to_token` write for the whole batch, and the SWA window releases freed together
at the end of the step in request-by-request order, so the same slots are handed out next. Under EAGLE
a request keeps its verify window's slots between steps, as sglang's spec v2 does (`_reserve_verify_windows`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import torch

from refsgl.srt.debug_hooks import DebugHooks
from refsgl.srt.managers.schedule_batch import Req, ScheduleBatch
from refsgl.srt.mem_cache.allocator import SWATokenToKVPoolAllocator
from refsgl.srt.mem_cache.hiradix_cache import HiRadixCache
from refsgl.srt.mem_cache.radix_cache import RadixCache
from refsgl.srt.model_executor.forward_batch_info import ForwardMode
from refsgl.srt.model_executor.model_runner import ModelRunner
from refsgl.srt.server_args import ServerArgs


class OutOfKVSlots(RuntimeError):
    pass


@dataclass
class SchedulerStats:
    """Cumulative counts of the events that exercise the KV cache (tests and the demo read them)."""

    prefill_batches: int = 0
    chunked_prefills: int = 0  # extend steps that left a request's prompt unfinished
    mixed_batches: int = 0
    decode_batches: int = 0
    prefix_hit_tokens: int = 0
    evicted_tokens: int = 0  # prefix-cache slots freed under memory pressure
    swa_released_tokens: int = 0  # SWA window holds dropped as positions left the window
    proposed_drafts: int = 0
    accepted_drafts: int = 0
    finished_requests: int = 0


class Scheduler:
    def __init__(self, server_args: ServerArgs, model_runner: ModelRunner, spec_worker=None, hooks: Optional[DebugHooks] = None):
        self.server_args = server_args
        self.model_runner = model_runner
        self.spec_worker = spec_worker
        self.hooks = hooks or DebugHooks()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self.is_swa = isinstance(self.allocator, SWATokenToKVPoolAllocator)
        self.sliding_window = model_runner.sliding_window_size
        self.num_draft_tokens = server_args.speculative_num_steps + 1 if spec_worker is not None else 0
        if server_args.enable_hierarchical_cache:
            self.tree_cache = HiRadixCache(
                self.allocator,
                model_runner.token_to_kv_pool,
                server_args.hicache_ratio,
                disable=server_args.disable_radix_cache,
            )
        else:
            self.tree_cache = RadixCache(
                self.allocator,
                bigram_keys=spec_worker is not None,
                swa_window=self.sliding_window if self.is_swa else None,
                disable=server_args.disable_radix_cache,
            )
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        # SWA window releases _process_result defers to _flush_kv_frees: (req-pool row, start, end).
        self._pending_frees: list[tuple[int, int, int]] = []
        self.chunked_req: Optional[Req] = None
        self.finished: list[Req] = []
        self.forward_ct = 0
        self.stats = SchedulerStats()
        self._rids = itertools.count()

    # ------------------------------------------------------------------ requests

    def add_request(self, input_ids: list[int], max_new_tokens: int) -> Req:
        limit = self.server_args.max_context_len - self.num_draft_tokens - 1
        if not input_ids or len(input_ids) + max_new_tokens > limit:
            raise ValueError(
                f"request of {len(input_ids)} prompt + {max_new_tokens} new tokens does not fit "
                f"max_context_len={self.server_args.max_context_len} (limit {limit})"
            )
        req = Req(rid=next(self._rids), origin_input_ids=list(input_ids), max_new_tokens=max_new_tokens)
        self.waiting.append(req)
        return req

    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req)

    # ------------------------------------------------------------------ memory

    def _future_need(self, req: Req) -> int:
        """Slots `req` may still allocate (prompt rest, outputs, one verify window)."""
        return (req.seq_len - req.cached_len) + (req.max_new_tokens - len(req.output_ids)) + self.num_draft_tokens

    def _free_capacity(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    def alloc_token_slots(self, num_tokens: int) -> torch.Tensor:
        slots = self.allocator.alloc(num_tokens)
        if slots is None:
            self.stats.evicted_tokens += self.tree_cache.evict(num_tokens - self.allocator.available_size())
            slots = self.allocator.alloc(num_tokens)
        if slots is None:
            raise OutOfKVSlots(f"need {num_tokens} KV slots, {self.allocator.available_size()} free after eviction")
        return slots

    def _write_slots(self, req: Req, start: int, slots: torch.Tensor):
        self.req_to_token_pool.write((req.req_pool_idx, slice(start, start + len(slots))), slots.to(torch.int32))

    def _write_slot_columns(self, rows: torch.Tensor, starts: torch.Tensor, slots: torch.Tensor, per_req: int):
        """Request i's `per_req` slots go to positions [starts[i], starts[i] + per_req) of row rows[i] (one write)."""
        values = slots.to(torch.int32)
        if per_req == 1:
            self.req_to_token_pool.write((rows, starts), values)
        else:
            columns = starts[:, None] + torch.arange(per_req, dtype=torch.int64, device=self.device)
            self.req_to_token_pool.write((rows[:, None], columns), values.view(-1, per_req))

    def _slots_of(self, req: Req, start: int, end: int) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].long()

    # ------------------------------------------------------------------ batch selection

    def get_next_batch_to_run(self) -> Optional[ScheduleBatch]:
        batch = self._get_new_prefill_batch()
        if batch is not None:
            return batch
        if self.running:
            return self._get_decode_batch()
        return None

    def _get_new_prefill_batch(self) -> Optional[ScheduleBatch]:
        if self.chunked_req is None and not self.waiting:
            return None
        budget = self.server_args.chunked_prefill_size
        reqs: list[Req] = []
        if self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            budget -= self._take_chunk(req, budget)
            reqs.append(req)
        reserved = sum(self._future_need(r) for r in self.running + reqs)
        while self.waiting and budget > 0 and self.chunked_req is None:
            if len(self.running) + len(reqs) >= self.server_args.max_running_requests:
                break
            req = self.waiting[0]
            prefix_slots, last_node = self.tree_cache.match_prefix(req.all_token_ids)
            self.tree_cache.inc_lock_ref(last_node)
            need = reserved + self._future_need(req) - len(prefix_slots)
            if need > self._free_capacity() or self.req_to_token_pool.available_size() == 0:
                self.tree_cache.dec_lock_ref(last_node)
                break
            self.waiting.pop(0)
            self._admit(req, prefix_slots, last_node)
            reserved += self._future_need(req)
            budget -= self._take_chunk(req, budget)
            reqs.append(req)
        if not reqs:
            return None

        self.stats.prefill_batches += 1
        self.stats.chunked_prefills += self.chunked_req is not None
        mode = ForwardMode.EXTEND
        riding = []
        if self.server_args.enable_mixed_chunk and self.running:
            mode = ForwardMode.MIXED
            self.stats.mixed_batches += 1
            riding = list(self.running)
            for req in riding:
                req.prefix_len, req.extend_len, req.is_last_chunk = req.cached_len, 1, True
        num_tokens = sum(r.extend_len for r in reqs) + len(riding)
        if self.allocator.available_size() >= num_tokens:
            # Request-by-request allocation would evict nothing and take these same slots in order.
            out_cache_loc = self.alloc_token_slots(num_tokens)
        else:
            out_cache_loc = torch.cat([self.alloc_token_slots(r.extend_len) for r in reqs + riding])
        start = 0
        for r in reqs:
            self._write_slots(r, r.prefix_len, out_cache_loc[start : start + r.extend_len])
            start += r.extend_len
        batch = ScheduleBatch(reqs + riding, mode, self.device, out_cache_loc)
        if riding:
            n = len(reqs)
            self._write_slot_columns(batch.req_pool_indices[n:], batch.seq_lens[n:], out_cache_loc[start:], 1)
        return batch

    def _admit(self, req: Req, prefix_slots: list[int], last_node):
        req.req_pool_idx = self.req_to_token_pool.alloc(1)[0]
        req.last_node = last_node
        req.cached_len = len(prefix_slots)
        self.stats.prefix_hit_tokens += len(prefix_slots)
        if prefix_slots:
            slots = torch.tensor(prefix_slots, dtype=torch.int64, device=self.device)
            self._write_slots(req, 0, slots)
            if self.is_swa:
                window_start = max(0, len(prefix_slots) - self.sliding_window)
                self.allocator.acquire_swa(slots[window_start:])
                req.swa_evicted_seqlen = window_start

    def _take_chunk(self, req: Req, budget: int) -> int:
        remaining = req.seq_len - req.cached_len
        req.prefix_len = req.cached_len
        req.extend_len = min(remaining, budget)
        req.is_last_chunk = req.extend_len == remaining
        if not req.is_last_chunk:
            self.chunked_req = req
        return req.extend_len

    def _get_decode_batch(self) -> ScheduleBatch:
        reqs = list(self.running)
        for req in reqs:
            req.prefix_len, req.extend_len, req.is_last_chunk = req.cached_len, 1, True
        if self.num_draft_tokens:
            # No out_cache_loc: the worker's forwards read their window's slots from the table.
            self._reserve_verify_windows(reqs)
            batch = ScheduleBatch(reqs, ForwardMode.DECODE, self.device, None)
        else:
            slots = self.alloc_token_slots(len(reqs))
            batch = ScheduleBatch(reqs, ForwardMode.DECODE, self.device, slots)
            # Request i's slot goes to position cached_len of its row.
            self._write_slot_columns(batch.req_pool_indices, batch.seq_lens, slots, 1)
        self.stats.decode_batches += 1
        return batch

    def _reserve_verify_windows(self, reqs: list[Req]):
        """Slots for every request's verify window, positions [cached_len, cached_len + num_draft_tokens),
        as sglang's spec v2 gives them (`eagle_prepare_for_decode`, `alloc_for_spec_decode`): the slots its
        last window left past the accepted tokens stay the request's (`kv_allocated_len`) and are written
        again by this window, only the positions past them get new slots (one allocation, one table
        write), and a step frees no slot; what is left past the last accepted token is freed when the
        request finishes."""
        rows, columns, ends = [], [], []
        for req in reqs:
            start, end = max(req.kv_allocated_len, req.cached_len), req.cached_len + self.num_draft_tokens
            ends.append(max(end, req.kv_allocated_len))
            if end > start:
                rows.extend(itertools.repeat(req.req_pool_idx, end - start))
                columns.extend(range(start, end))
        if rows:
            slots = self.alloc_token_slots(len(rows))
            rows_t, columns_t = torch.tensor([rows, columns], dtype=torch.int64, device=self.device).unbind(0)
            self.req_to_token_pool.write((rows_t, columns_t), slots.to(torch.int32))
        for req, end in zip(reqs, ends):
            req.kv_allocated_len = end

    # ------------------------------------------------------------------ running a step

    def step(self) -> Optional[ScheduleBatch]:
        batch = self.get_next_batch_to_run()
        if batch is None:
            return None
        if self.spec_worker is not None:
            result = self.spec_worker.forward_batch_generation(batch)
            self._process_result(batch, result.next_token_ids, result.verify_output)
        else:
            forward_batch = batch.to_forward_batch(self.model_runner)
            self.hooks.fire("batch_built", forward_batch=forward_batch, runner=self.model_runner)
            logits_output = self.model_runner.forward(forward_batch).logits_output
            next_ids = self.model_runner.sample(logits_output, forward_batch).tolist()
            self._process_result(batch, [[t] if r.is_last_chunk else [] for r, t in zip(batch.reqs, next_ids)], None)
        self.forward_ct += 1
        self.hooks.fire("step_end", scheduler=self, batch=batch)
        return batch

    def _process_result(self, batch: ScheduleBatch, new_tokens: list[list[int]], verify_output):
        # A decode batch is the running requests; an extend batch's finished prompts join them.
        running = None if batch.forward_mode.is_decode() else set(self.running)
        for req, tokens in zip(batch.reqs, new_tokens):
            # A verify can accept past max_new_tokens; drop the surplus (and, below, its KV).
            tokens = tokens[: req.max_new_tokens - len(req.output_ids)]
            if verify_output is not None:
                # Verify wrote positions n .. n + num_draft - 1; keep the accepted ones (the slots of the
                # others stay the request's, for its next window).
                keep = len(tokens)
                self.stats.proposed_drafts += self.num_draft_tokens - 1
                self.stats.accepted_drafts += keep - 1
                req.cached_len += keep
            else:
                req.cached_len += req.extend_len
            req.output_ids.extend(tokens)
            if req is self.chunked_req:
                continue
            if running is not None and req not in running:
                self.running.append(req)
            if len(req.output_ids) >= req.max_new_tokens:
                self._finish(req)
            elif self.is_swa:
                self._release_out_of_window(req)
        self._flush_kv_frees()

    def _release_out_of_window(self, req: Req):
        new_start = max(0, req.cached_len - self.sliding_window)
        if new_start > req.swa_evicted_seqlen:
            self._pending_frees.append((req.req_pool_idx, req.swa_evicted_seqlen, new_start))
            self.stats.swa_released_tokens += new_start - req.swa_evicted_seqlen
            req.swa_evicted_seqlen = new_start

    def _flush_kv_frees(self):
        """Release the deferred SWA window holds as `free_swa` entry by entry in the order deferred would,
        with a fixed number of torch calls."""
        pending, self._pending_frees = self._pending_frees, []
        if not pending:
            return
        rows, columns = [], []
        # Last entry first: the free lists take freed slots at the front, so one call on the
        # concatenation leaves them in the order that entry-by-entry calls would.
        for row, start, end in reversed(pending):
            rows.extend(itertools.repeat(row, end - start))
            columns.extend(range(start, end))
        rows_t, columns_t = torch.tensor([rows, columns], dtype=torch.int64, device=self.device).unbind(0)
        slots = self.req_to_token_pool.req_to_token[rows_t, columns_t].long()
        if not self.allocator.free_and_release_swa(slots, torch.ones_like(slots, dtype=torch.bool)):
            # A slot is listed twice (a prefix that requests share left their windows together): one by one.
            for row, start, end in pending:
                self.allocator.free_swa(self.req_to_token_pool.req_to_token[row, start:end].long())

    def _finish(self, req: Req):
        self._flush_kv_frees()  # the frees of the requests before it come first
        req.finished = True
        self.running.remove(req)
        slots = self._slots_of(req, 0, req.cached_len)
        keys = req.all_token_ids[: req.cached_len + 1]
        duplicates = self.tree_cache.insert(keys, slots.tolist())
        if self.is_swa:
            self.allocator.free_swa(slots[req.swa_evicted_seqlen :])
        if duplicates:
            self.allocator.free(torch.tensor(duplicates, dtype=torch.int64, device=self.device))
        if req.kv_allocated_len > req.cached_len:  # the last verify window's slots past the accepted tokens
            self.allocator.free(self._slots_of(req, req.cached_len, req.kv_allocated_len))
        self.tree_cache.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        self.finished.append(req)
        self.stats.finished_requests += 1

    # ------------------------------------------------------------------ maintenance

    def abort_all_requests(self):
        """Drop every request; their KV slots are reclaimed by the `flush_cache` that must follow."""
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            self.req_to_token_pool.free(req.req_pool_idx)
            req.finished = True
        self.waiting, self.running, self.chunked_req = [], [], None

    def flush_cache(self):
        """Reset the prefix cache and every slot allocator (sglang's flush_cache); only when idle."""
        if not self.is_idle():
            raise RuntimeError("flush_cache: requests are still waiting or running; abort or finish them first")
        self.tree_cache.reset()
        self.allocator.reset()
        self.req_to_token_pool.reset()
