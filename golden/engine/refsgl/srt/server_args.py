"""ServerArgs: every knob of the engine, validated once so a bad setting fails with its field name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

ATTENTION_LAYOUTS = ("mha", "mla", "swa")
KV_CANARY_MODES = ("none", "log", "raise")
KV_CANARY_REAL_KV_MODES = ("none", "partial", "all")
ATTENTION_BACKENDS = ("auto", "torch_native", "triton")


@dataclass
class ServerArgs:
    # Model shape (a tiny random-weight llama-like model; see models/tiny_llama.py).
    attention_layout: str = "mha"
    vocab_size: int = 128
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    kv_lora_rank: int = 32  # mla
    qk_rope_head_dim: int = 8  # mla
    sliding_window_size: int = 32  # swa: every other layer attends to the last W positions
    random_seed: int = 0
    dtype: str = "float32"
    device: str = "auto"

    # Memory and scheduling.
    max_running_requests: int = 8
    max_context_len: int = 512
    max_total_tokens: int = 4096
    swa_max_total_tokens: Optional[int] = None  # defaults to max_total_tokens
    chunked_prefill_size: int = 64
    enable_mixed_chunk: bool = False
    disable_radix_cache: bool = False
    # Hierarchical cache (sglang's HiCache): the prefix cache also keeps its KV in a host pool of
    # hicache_ratio x the device pool's slots and loads it back on a hit (mem_cache/hiradix_cache.py).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0

    # Speculative decoding.
    speculative_algorithm: Optional[str] = None  # None | "EAGLE"
    speculative_num_steps: Optional[int] = None  # EAGLE draft chain length; 3 when EAGLE is on, else None

    # Attention kernels: "auto" picks triton on CUDA and torch_native (the reference) elsewhere.
    attention_backend: str = "auto"

    # Graphs and tracing.
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 8
    enable_step_tracing: bool = False

    # KV canary (read by the canary runtime once the engine is instrumented).
    kv_canary: str = "none"
    kv_canary_real_kv: str = "none"
    kv_canary_sweep_interval: int = 0  # sglang's idle-cache sweep interval (the runtime validates it)

    def __post_init__(self):
        self._choice("attention_layout", ATTENTION_LAYOUTS)
        self._choice("kv_canary", KV_CANARY_MODES)
        self._choice("kv_canary_real_kv", KV_CANARY_REAL_KV_MODES)
        self._choice("attention_backend", ATTENTION_BACKENDS)
        if self.speculative_algorithm not in (None, "EAGLE"):
            raise ValueError(f"ServerArgs.speculative_algorithm: expected None or 'EAGLE', got {self.speculative_algorithm!r}")
        if self.speculative_algorithm == "EAGLE" and self.speculative_num_steps is None:
            self.speculative_num_steps = 3
        if self.speculative_algorithm is None and self.speculative_num_steps is not None:
            raise ValueError("ServerArgs.speculative_num_steps: set only together with speculative_algorithm")
        for name in ("max_running_requests", "max_context_len", "max_total_tokens", "chunked_prefill_size",
                     "cuda_graph_max_bs", "speculative_num_steps", "sliding_window_size"):
            if getattr(self, name) is None:
                continue
            if getattr(self, name) < 1:
                raise ValueError(f"ServerArgs.{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("ServerArgs.num_key_value_heads: must divide num_attention_heads")
        if self.speculative_algorithm == "EAGLE" and self.enable_mixed_chunk:
            raise ValueError("ServerArgs.enable_mixed_chunk: not supported with speculative decoding")
        if self.enable_hierarchical_cache:
            if self.speculative_algorithm is not None or self.attention_layout == "swa":
                raise ValueError("ServerArgs.enable_hierarchical_cache: the host tier holds one pool of full-attention "
                                 "KV; not supported with speculative decoding (a draft pool) or SWA (a window pool)")
            if self.hicache_ratio <= 0:
                raise ValueError(f"ServerArgs.hicache_ratio: must be > 0, got {self.hicache_ratio}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.attention_backend == "auto":
            self.attention_backend = "triton" if torch.device(self.device).type == "cuda" else "torch_native"
        if self.swa_max_total_tokens is None:
            self.swa_max_total_tokens = self.max_total_tokens

    def _choice(self, name: str, allowed: tuple):
        if getattr(self, name) not in allowed:
            raise ValueError(f"ServerArgs.{name}: expected one of {allowed}, got {getattr(self, name)!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    @property
    def is_eagle(self) -> bool:
        return self.speculative_algorithm == "EAGLE"

    def replace(self, **changes) -> "ServerArgs":
        return dataclasses.replace(self, **changes)
