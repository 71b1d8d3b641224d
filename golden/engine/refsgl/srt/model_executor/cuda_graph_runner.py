"""Target CUDA graphs: capture the model's decode forward once per batch size, replay it with new inputs.

With EAGLE the target never decodes one token at a time: every decode step is a TARGET_VERIFY
of the draft chain (speculative_num_steps + 1 tokens per request), so that is the forward the
graphs capture, as sglang's decode graph runner does for speculative targets. Inputs live in
static buffers; replay copies the batch into them (padding the rest with slot 0 / request row 0)
so every replay reads and writes the same addresses.
"""

from __future__ import annotations

import bisect
import weakref
from typing import TYPE_CHECKING, Callable

import torch

from refsgl.srt.layers.logits_processor import LogitsProcessorOutput
from refsgl.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:  # pragma: no cover
    from refsgl.srt.model_executor.model_runner import ModelRunner

_global_graph_memory_pool = None
# Graphs captured into the global pool. torch releases a private pool once its last graph
# is gone, and capturing into a released pool's handle trips an allocator assert, so the
# handle is dropped when an engine that used it has been freed (tests build many engines).
_graphs_in_global_pool: "weakref.WeakSet[torch.cuda.CUDAGraph]" = weakref.WeakSet()
_global_pool_used = False


def get_global_graph_memory_pool():
    global _global_graph_memory_pool, _global_pool_used
    if _global_pool_used and not _graphs_in_global_pool:
        _global_graph_memory_pool, _global_pool_used = None, False
    return _global_graph_memory_pool


def set_global_graph_memory_pool(pool):
    global _global_graph_memory_pool
    _global_graph_memory_pool = pool


def remember_graph_in_global_pool(graph, pool):
    global _global_pool_used
    if pool is not None and pool == _global_graph_memory_pool:
        _graphs_in_global_pool.add(graph)
        _global_pool_used = True


def warm_cublas_on_stream(stream, device):
    """Give cuBLAS its per-stream workspace outside any capture.

    cuBLAS caches one workspace per (handle, stream) on first use. Made during a capture, it
    lives in that graph's private pool and dangles once the pool is released; torch hands out
    streams from a small recycled pool, so a later engine would then capture with a freed
    workspace (CUBLAS_STATUS_EXECUTION_FAILED). A first use outside capture makes it ordinary,
    long-lived memory.
    """
    with torch.cuda.stream(stream):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.ones((8, 8), device=device, dtype=dtype)
            torch.nn.functional.linear(x, x)
    stream.synchronize()


def get_batch_sizes_to_capture(max_bs: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, max_bs + 1, 8))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})


class CudaGraphRunner:
    """Captures and replays decode (or, with EAGLE, target-verify) forward passes of the target model runner."""

    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.device_module = torch.get_device_module(self.device)
        server_args = model_runner.server_args
        self.capture_bs = get_batch_sizes_to_capture(server_args.cuda_graph_max_bs)
        self.max_bs = self.capture_bs[-1]
        if server_args.is_eagle:
            self.capture_forward_mode = ForwardMode.TARGET_VERIFY
            self.num_tokens_per_bs = server_args.speculative_num_steps + 1  # last verified token + the chain
        else:
            self.capture_forward_mode = ForwardMode.DECODE
            self.num_tokens_per_bs = 1
        # Padded rows: sequence length 1 for a decode (position 0 written), prefix 0 for a verify.
        self.seq_len_fill_value = 1 if self.capture_forward_mode.is_decode() else 0
        self.stream = self.device_module.Stream()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}

        max_num_tokens = self.max_bs * self.num_tokens_per_bs
        with torch.device(self.device):
            self.input_ids = torch.zeros((max_num_tokens,), dtype=torch.int64)
            self.req_pool_indices = torch.zeros((self.max_bs,), dtype=torch.int64)
            self.seq_lens = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int64)
            self.positions = torch.zeros((max_num_tokens,), dtype=torch.int64)
            self.out_cache_loc = torch.zeros((max_num_tokens,), dtype=torch.int64)
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        mode = forward_batch.forward_mode
        if mode != self.capture_forward_mode or not 0 < forward_batch.batch_size <= self.max_bs:
            return False
        return mode.is_decode() or forward_batch.num_tokens_per_req == self.num_tokens_per_bs

    def capture(self):
        with torch.no_grad():
            for bs in reversed(self.capture_bs):
                graph, out = self._capture(bs, self.model_runner.model.forward)
                self.graphs[bs] = graph
                self.outputs[bs] = out

    def _static_forward_batch(self, bs: int) -> ForwardBatch:
        num_tokens = bs * self.num_tokens_per_bs
        return ForwardBatch(
            forward_mode=self.capture_forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:num_tokens],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            positions=self.positions[:num_tokens],
            out_cache_loc=self.out_cache_loc[:num_tokens],
            num_tokens_per_req=None if self.capture_forward_mode.is_decode() else self.num_tokens_per_bs,
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
        )

    def _capture(self, bs: int, forward: Callable):
        graph = torch.cuda.CUDAGraph()
        stream = self.stream
        forward_batch = self._static_forward_batch(bs)
        attn_backend = self.model_runner.attn_backend
        attn_backend.init_forward_metadata_capture_cuda_graph(forward_batch, tokens_per_req=self.num_tokens_per_bs)

        def run_once():
            return forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

        for _ in range(2):
            self.device_module.synchronize()
            self.model_runner.tp_group.barrier()
            run_once()

        if get_global_graph_memory_pool() is None:
            set_global_graph_memory_pool(self.device_module.graph_pool_handle())
        pool = get_global_graph_memory_pool()
        out = self._capture_graph(graph, pool, stream, run_once)
        return graph, out

    def _capture_graph(self, graph, pool, stream, run_once):
        warm_cublas_on_stream(stream, self.model_runner.device)
        remember_graph_in_global_pool(graph, pool)
        with self.device_module.graph(graph, pool=pool, stream=stream):
            out = run_once()
        return out

    def replay(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False) -> LogitsProcessorOutput:
        raw_bs = forward_batch.batch_size
        raw_num_tokens = raw_bs * self.num_tokens_per_bs
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        if bs != raw_bs:
            # Padded rows (req-pool row 0, positions 0) attend to slot 0 only and write slot 0, the pool's padding slot.
            num_tokens = bs * self.num_tokens_per_bs
            self.input_ids[raw_num_tokens:num_tokens].zero_()
            self.req_pool_indices[raw_bs:bs].zero_()
            self.seq_lens[raw_bs:bs].fill_(self.seq_len_fill_value)
            self.positions[raw_num_tokens:num_tokens].zero_()
            self.out_cache_loc[raw_num_tokens:num_tokens].zero_()
        self.input_ids[:raw_num_tokens].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.positions[:raw_num_tokens].copy_(forward_batch.positions)
        self.out_cache_loc[:raw_num_tokens].copy_(forward_batch.out_cache_loc)
        self.graphs[bs].replay()
        out = self.outputs[bs]
        # Decode: one logits row per request; verify: one per token (every draft position is scored).
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:raw_num_tokens],
            hidden_states=out.hidden_states[:raw_num_tokens],
        )
