"""CUDA graphs for the EAGLE multi-step draft: the whole chain of draft forwards, captured once per batch size.

`EAGLEWorkerV2.draft_forward` runs `speculative_num_steps - 1` draft forwards, each feeding its
best token and hidden state to the next. A graph per batch size captures that loop as it runs
eagerly, each step's own context included, so a replay re-runs every step with the batch copied
into static buffers: the request rows, the pre-draft lengths, the chain's first token and the
hidden state it came from. Each step derives its positions and KV slots from those inside the
graph. Padding rows take req-pool row 0 with length 1, so they read and write slot 0 only.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable

import torch

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


class EAGLEDraftCudaGraphRunner:
    """Captures and replays the draft runner's multi-step draft chain (topk = 1)."""

    def __init__(self, eagle_worker: "EAGLEWorkerV2"):
        self.eagle_worker = eagle_worker
        self.model_runner = model_runner = eagle_worker.draft_runner
        self.device = model_runner.device
        self.device_module = torch.get_device_module(self.device)
        self.speculative_num_steps = eagle_worker.speculative_num_steps
        self.capture_bs = get_batch_sizes_to_capture(model_runner.server_args.cuda_graph_max_bs)
        self.max_bs = self.capture_bs[-1]
        self.stream = self.device_module.Stream()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

        hidden_size = model_runner.model_config.hidden_size
        with torch.device(self.device):
            # Read by the graph: what the chain starts from.
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.ones((self.max_bs,), dtype=torch.int64)
            self.topk_index = torch.zeros((self.max_bs, 1), dtype=torch.int64)
            self.hidden_states = torch.zeros((self.max_bs, hidden_size), dtype=model_runner.dtype)
            # The batch's own ids, positions and slots: draft_forward replaces them at every step.
            self.positions = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.out_cache_loc = torch.zeros((self.max_bs,), dtype=torch.int64)
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and 0 < forward_batch.batch_size <= self.max_bs

    def capture(self):
        with torch.no_grad():
            for bs in reversed(self.capture_bs):
                graph, out = self.capture_one_batch_size(bs, self.eagle_worker.draft_forward)
                self.graphs[bs] = graph
                self.outputs[bs] = out

    def _capture_init(self, bs: int) -> ForwardBatch:
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.topk_index[:bs, 0],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
            spec_info=EagleDraftInput(hidden_states=self.hidden_states[:bs], topk_index=self.topk_index[:bs]),
        )
        # Planned once for every step of the chain (host shapes only); the steps' forward contexts keep it.
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(forward_batch, tokens_per_req=1)
        forward_batch.forward_metadata_ready = True
        return forward_batch

    def capture_one_batch_size(self, bs: int, forward: Callable):
        graph = torch.cuda.CUDAGraph()
        stream = self.stream
        forward_batch = self._capture_init(bs)
        static = (forward_batch.input_ids, forward_batch.positions, forward_batch.out_cache_loc)

        def run_once():
            try:
                return forward(forward_batch)
            finally:
                # draft_forward moves the batch along the chain; every run starts from the static buffers.
                forward_batch.input_ids, forward_batch.positions, forward_batch.out_cache_loc = static
                forward_batch.spec_info.hidden_states = self.hidden_states[:bs]

        for _ in range(2):
            self.device_module.synchronize()
            self.model_runner.tp_group.barrier()
            run_once()

        if get_global_graph_memory_pool() is None:
            set_global_graph_memory_pool(self.device_module.graph_pool_handle())
        pool = get_global_graph_memory_pool()
        warm_cublas_on_stream(stream, self.model_runner.device)
        remember_graph_in_global_pool(graph, pool)
        # No canary context around the capture: each draft step enters its own inside draft_forward
        # (the draft-step site), and the captured graph records them; the draft site around replay()
        # plans every sub-forward. An active context here would nest with the steps' contexts.
        with self.device_module.graph(graph, pool=pool, stream=stream):
            out = run_once()
        return graph, out

    def replay(self, forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(parent_list, top_scores_index, draft_tokens) of the chain, as `draft_forward` returns them."""
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            # Padded rows: req-pool row 0 from position 0, so every step reads and writes slot 0 only.
            self.req_pool_indices[raw_bs:bs].zero_()
            self.seq_lens[raw_bs:bs].fill_(1)
            self.topk_index[raw_bs:bs].zero_()
            self.hidden_states[raw_bs:bs].zero_()
        spec_info = forward_batch.spec_info
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.topk_index[:raw_bs].copy_(spec_info.topk_index)
        self.hidden_states[:raw_bs].copy_(spec_info.hidden_states)
        self.graphs[bs].replay()
        parent_list, top_scores_index, draft_tokens = self.outputs[bs]
        return parent_list[:raw_bs], top_scores_index[:raw_bs], draft_tokens[:raw_bs]
