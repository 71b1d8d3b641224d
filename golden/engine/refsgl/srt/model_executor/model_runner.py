"""ModelRunner: owns one worker's model, its KV memory pools and its decode CUDA graphs.

The target model and the EAGLE draft model each get one; the draft runner shares the
target's `req_to_token` table and slot allocator but keeps its own KV pool.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from refsgl.srt.configs.model_config import ModelConfig
from refsgl.srt.distributed import get_tp_group
from refsgl.srt.eplb.expert_distribution import get_global_expert_distribution_recorder
from refsgl.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from refsgl.srt.layers.logits_processor import LogitsProcessorOutput
from refsgl.srt.mem_cache.allocator import SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
from refsgl.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    SWAKVPool,
)
from refsgl.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from refsgl.srt.model_executor.forward_batch_info import ForwardBatch
from refsgl.srt.models.tiny_llama import build_model
from refsgl.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class ModelRunnerOutput:
    logits_output: LogitsProcessorOutput
    can_run_graph: bool


class ModelRunner:
    """Runs forward passes of one model over the paged KV cache."""

    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        *,
        req_to_token_pool: Optional[ReqToTokenPool] = None,
        token_to_kv_pool_allocator=None,
        is_draft_worker: bool = False,
    ):
        self.model_config = model_config
        self.server_args = server_args
        self.device = server_args.device
        self.dtype = server_args.torch_dtype
        self.is_draft_worker = is_draft_worker
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.max_running_requests = server_args.max_running_requests
        self.sliding_window_size = model_config.sliding_window_size
        self.tp_group = get_tp_group()
        self.forward_pass_id = 0
        self.graph_runner: Optional[CudaGraphRunner] = None
        self.initialize()

    def initialize(self):
        self.load_model()
        self.init_memory_pool(self.server_args.max_total_tokens)
        self.init_attention_backend()
        self.init_device_graphs()

    def load_model(self):
        self.model = build_model(self.model_config, seed=self.server_args.random_seed + int(self.is_draft_worker))
        self.model.to(device=self.device, dtype=self.dtype)
        self.model.eval()

    def init_memory_pool(self, total_tokens: int):
        cfg = self.model_config
        if self.req_to_token_pool is None:
            # One spare row: a chunked-prefill request keeps its row between batches.
            self.req_to_token_pool = ReqToTokenPool(
                size=self.max_running_requests + 1,
                max_context_len=self.server_args.max_context_len,
                device=self.device,
            )
        if cfg.attention_layout == "mla":
            self.token_to_kv_pool = MLATokenToKVPool(
                size=total_tokens,
                kv_lora_rank=cfg.kv_lora_rank,
                qk_rope_head_dim=cfg.qk_rope_head_dim,
                layer_num=cfg.num_hidden_layers,
                dtype=self.dtype,
                device=self.device,
            )
        elif cfg.attention_layout == "swa":
            self.token_to_kv_pool = SWAKVPool(
                size=total_tokens,
                size_swa=self.server_args.swa_max_total_tokens,
                swa_attention_layer_ids=cfg.swa_layer_ids,
                full_attention_layer_ids=cfg.full_layer_ids,
                head_num=cfg.num_key_value_heads,
                head_dim=cfg.head_dim,
                dtype=self.dtype,
                device=self.device,
            )
        else:
            self.token_to_kv_pool = MHATokenToKVPool(
                size=total_tokens,
                head_num=cfg.num_key_value_heads,
                head_dim=cfg.head_dim,
                layer_num=cfg.num_hidden_layers,
                dtype=self.dtype,
                device=self.device,
            )
        if self.token_to_kv_pool_allocator is None:
            if isinstance(self.token_to_kv_pool, SWAKVPool):
                self.token_to_kv_pool_allocator = SWATokenToKVPoolAllocator(self.token_to_kv_pool)
            else:
                self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(total_tokens, device=self.device)

    def init_attention_backend(self):
        if self.server_args.attention_backend == "triton":
            # Imported here so that torch-native engines (CPU) never load Triton.
            from refsgl.srt.layers.attention.triton_backend import TritonAttnBackend

            self.attn_backend = TritonAttnBackend(self)
        else:
            self.attn_backend = TorchNativeAttnBackend(self)

    def init_device_graphs(self):
        """Capture decode CUDA graphs (target runner only; the EAGLE worker captures its own)."""
        if self.is_draft_worker or self.server_args.disable_cuda_graph:
            return
        if torch.device(self.device).type != "cuda":
            logger.info("CUDA graphs need a CUDA device; decode runs eagerly on %s", self.device)
            return
        self.graph_runner = CudaGraphRunner(self)

    def forward(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: bool = False,
        pp_proxy_tensors=None,
    ) -> ModelRunnerOutput:
        self.forward_pass_id += 1
        step_span_ctx = (
            torch.profiler.record_function(f"refsgl.forward.{forward_batch.forward_mode.name.lower()}")
            if self.server_args.enable_step_tracing
            else contextlib.nullcontext()
        )
        with (
            step_span_ctx,
            get_global_expert_distribution_recorder().with_forward_pass(
                self.forward_pass_id,
                forward_batch,
            ) as recorder_outputs,
        ):
            output = self._forward_raw(forward_batch, skip_attn_backend_init, pp_proxy_tensors)
        recorder_outputs["can_run_graph"] = output.can_run_graph
        return output

    def _forward_raw(
        self,
        forward_batch: ForwardBatch,
        skip_attn_backend_init: bool,
        pp_proxy_tensors=None,
    ) -> ModelRunnerOutput:
        if pp_proxy_tensors is not None:
            raise ValueError("refsgl runs a single pipeline stage; pp_proxy_tensors must be None")
        mode = forward_batch.forward_mode
        can_run_graph = bool(
            mode.is_decode() and self.graph_runner is not None and self.graph_runner.can_run(forward_batch)
        )
        if can_run_graph:
            logits_output = self.graph_runner.replay(forward_batch, skip_attn_backend_init=skip_attn_backend_init)
        elif mode.is_decode():
            logits_output = self.forward_decode(forward_batch, skip_attn_backend_init)
        elif mode.is_extend():
            logits_output = self.forward_extend(forward_batch, skip_attn_backend_init)
        elif mode.is_idle():
            logits_output = self.forward_idle(forward_batch)
        else:
            raise ValueError(f"invalid forward mode: {mode}")
        return ModelRunnerOutput(logits_output=logits_output, can_run_graph=can_run_graph)

    def forward_decode(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False):
        if not skip_attn_backend_init:
            self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def forward_extend(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool = False):
        if not skip_attn_backend_init:
            self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits_output: LogitsProcessorOutput, forward_batch: ForwardBatch) -> torch.Tensor:
        """Greedy next token of each request (one logits row per request), as int32 token ids like sglang's sampler."""
        return torch.argmax(logits_output.next_token_logits, dim=-1).to(torch.int32)

    def forward_idle(self, forward_batch: ForwardBatch):
        hidden = torch.empty((0, self.model_config.hidden_size), device=self.device, dtype=self.dtype)
        logits = torch.empty((0, self.model_config.vocab_size), device=self.device, dtype=self.dtype)
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)
