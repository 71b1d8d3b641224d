"""CUDA graphs for the EAGLE draft-extend that follows each verify.

Every request contributes a fixed `speculative_num_steps + 1` tokens (all verified
positions), so one graph per batch size covers every acceptance pattern.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable

import torch

from refsgl.srt.layers.logits_processor import LogitsProcessorOutput
from refsgl.srt.model_executor.cuda_graph_runner import (
    get_batch_sizes_to_capture,
    get_global_graph_memory_pool,
    remember_graph_in_global_pool,
    set_global_graph_memory_pool,
    warm_cublas_on_stream,
)
from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from refsgl.srt.speculative.spec_info import EagleDraftInput

if TYPE_CHECKING:  # pragma: no cover
    from refsgl.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2


class EAGLEDraftExtendCudaGraphRunner:
    """Captures and replays the draft runner's fixed-length draft-extend forward."""

    def __init__(self, eagle_worker: "EAGLEWorkerV2"):
        self.eagle_worker = eagle_worker
        self.model_runner = model_runner = eagle_worker.draft_runner
        self.device = model_runner.device
        self.device_module = torch.get_device_module(self.device)
        self.num_tokens_per_bs = eagle_worker.speculative_num_steps + 1
        self.capture_bs = get_batch_sizes_to_capture(model_runner.server_args.cuda_graph_max_bs)
        self.max_bs = self.capture_bs[-1]
        self.stream = self.device_module.Stream()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}

        max_tokens = self.max_bs * self.num_tokens_per_bs
        hidden_size = model_runner.model_config.hidden_size
        with torch.device(self.device):
            self.input_ids = torch.zeros((max_tokens,), dtype=torch.int64)
            self.positions = torch.zeros((max_tokens,), dtype=torch.int64)
            self.out_cache_loc = torch.zeros((max_tokens,), dtype=torch.int64)
            self.hidden_states = torch.zeros((max_tokens, hidden_size), dtype=model_runner.dtype)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), self.num_tokens_per_bs, dtype=torch.int64)
            self.extend_prefix_lens = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.extend_seq_lens = torch.full((self.max_bs,), self.num_tokens_per_bs, dtype=torch.int64)
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode.is_draft_extend()
            and forward_batch.num_tokens_per_req == self.num_tokens_per_bs
            and 0 < forward_batch.batch_size <= self.max_bs
        )

    def capture(self):
        with torch.no_grad():
            for bs in reversed(self.capture_bs):
                graph, out = self.capture_one_batch_size(bs, self.model_runner.model.forward)
                self.graphs[bs] = graph
                self.outputs[bs] = out

    def _capture_init(self, bs: int) -> ForwardBatch:
        num_tokens = bs * self.num_tokens_per_bs
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            batch_size=bs,
            input_ids=self.input_ids[:num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            positions=self.positions[:num_tokens],
            out_cache_loc=self.out_cache_loc[:num_tokens],
            extend_prefix_lens=self.extend_prefix_lens[:bs],
            extend_seq_lens=self.extend_seq_lens[:bs],
            num_tokens_per_req=self.num_tokens_per_bs,
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
            spec_info=EagleDraftInput(hidden_states=self.hidden_states[:num_tokens]),
        )
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            forward_batch, tokens_per_req=self.num_tokens_per_bs
        )
        return forward_batch

    def capture_one_batch_size(self, bs: int, forward: Callable):
        graph = torch.cuda.CUDAGraph()
        stream = self.stream
        forward_batch = self._capture_init(bs)

        def run_once():
            return forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        for _ in range(2):
            self.device_module.synchronize()
            self.model_runner.tp_group.barrier()
            run_once()

        if get_global_graph_memory_pool() is None:
            set_global_graph_memory_pool(self.device_module.graph_pool_handle())
        out = self._capture_graph(graph, get_global_graph_memory_pool(), stream, run_once)
        return graph, out

    def _capture_graph(self, graph, pool, stream, run_once):
        warm_cublas_on_stream(stream, self.model_runner.device)
        remember_graph_in_global_pool(graph, pool)
        with self.device_module.graph(graph, pool=pool, stream=stream):
            out = run_once()
        return out

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        raw_bs = forward_batch.batch_size
        raw_tokens = raw_bs * self.num_tokens_per_bs
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            # Padded requests read and write slot 0 only (the pool's padding slot).
            self.input_ids.zero_()
            self.positions.zero_()
            self.out_cache_loc.zero_()
            self.hidden_states.zero_()
            self.req_pool_indices.zero_()
            self.extend_prefix_lens.zero_()
            self.seq_lens.fill_(self.num_tokens_per_bs)
        self.input_ids[:raw_tokens].copy_(forward_batch.input_ids)
        self.positions[:raw_tokens].copy_(forward_batch.positions)
        self.out_cache_loc[:raw_tokens].copy_(forward_batch.out_cache_loc)
        self.hidden_states[:raw_tokens].copy_(forward_batch.spec_info.hidden_states)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.extend_prefix_lens[:raw_bs].copy_(forward_batch.extend_prefix_lens)
        self.graphs[bs].replay()
        out = self.outputs[bs]
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:raw_tokens],
            hidden_states=out.hidden_states[:raw_tokens],
        )
